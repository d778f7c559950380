// The engine key: a shared secret by which an engine's HTTP API tells the routers from anyone
// else who reaches its port (docs/operations.md, "The engine key").
//
// The operator writes one or more keys, one per line, in a file (`[engine] key_file` of the
// controller, `engine_key_file` of the router). The controller passes every engine it launches
// the keys in BATON_ENGINE_KEYS, joined with commas; a router sends the file's first key as
// `Authorization: Bearer KEY` on every request to an engine. An engine given keys serves a
// request only when it carries one of them (GET /health and GET /metrics aside). With two
// keys in the file a key is rotated without a refusal: the new one is added second, every
// engine relaunched, then the two lines swapped and the routers told (SIGHUP).
//
// The file is opened without blocking and checked on its descriptor (a FIFO in its place does
// not hold a launch up). A key is 16 to 1024 characters of RFC 6750's b64token set
// (A-Z a-z 0-9 - . _ ~ + / =):
// `openssl rand -base64 32` makes one. In the file, blank lines and lines starting with '#'
// are skipped and each line is trimmed of surrounding blanks. The file must not be readable
// by every user. Errors name the file or the variable and the line, never a key.
// Plain functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "proto/http/http_server.h"

namespace baton {

inline constexpr char kEngineKeysEnv[] = "BATON_ENGINE_KEYS";
inline constexpr size_t kEngineKeyMinBytes = 16;
inline constexpr size_t kEngineKeyMaxBytes = 1024;
inline constexpr size_t kEngineKeyFileMaxBytes = 64 * 1024;

// OK when `key` is a key by the rules above; else InvalidArgument saying why (not the key).
Status CheckEngineKey(std::string_view key);

// The keys of the file at `path`, in file order (at least one); FailedPrecondition naming the
// path when it cannot be read, is no regular file, is readable or writable by others, is
// longer than kEngineKeyFileMaxBytes, holds no key, or a line is no key.
Result<std::vector<std::string>> ReadEngineKeyFile(const std::string& path);

// A configuration's key file setting (`setting` names it in errors: "engine.key_file"): an
// absolute path to a file ReadEngineKeyFile reads; InvalidArgument naming the setting.
Status CheckEngineKeyFileSetting(std::string_view setting, const std::string& path);

// The keys of BATON_ENGINE_KEYS' value `list` (none when empty); InvalidArgument naming the
// variable when an element is empty or no key.
Result<std::vector<std::string>> ParseEngineKeys(std::string_view list);
std::string JoinEngineKeys(const std::vector<std::string>& keys);

// Whether `request` carries `Authorization: Bearer K` (the scheme in any case) with K one of
// `keys`, each compared in constant time.
bool BearerMatches(const HttpRequest& request, const std::vector<std::string>& keys);

// The 401 an engine answers a request without the key: an OpenAI-shaped authentication_error
// with `WWW-Authenticate: Bearer`.
void RespondEngineKeyMissing(HttpExchange* exchange);

}  // namespace baton
