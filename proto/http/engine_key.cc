#include "proto/http/engine_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/beast/core/string.hpp>
#include <cerrno>
#include <cstring>

#include "base/io/unique_fd.h"
#include "base/text/constant_time.h"

namespace baton {
namespace {

bool IsB64TokenChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         std::string_view("-._~+/=").find(c) != std::string_view::npos;
}

std::string_view Trimmed(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

// The file's bytes (at most kEngineKeyFileMaxBytes + 1). Opened without blocking (a FIFO put
// in its place does not hold the caller, often a launch) and checked on the descriptor: a
// regular file, not open to every user.
Result<std::string> ReadKeyFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) {
    return FailedPrecondition("engine key file " + path + ": " + std::strerror(errno) +
                              " (make one: openssl rand -base64 32 > " + path + ")");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat engine key file " + path, errno);
  if (!S_ISREG(st.st_mode)) {
    return FailedPrecondition("engine key file " + path + " is not a regular file");
  }
  if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return FailedPrecondition("engine key file " + path + " is open to every user (mode " + mode +
                              "): chmod o-rw " + path);
  }
  std::string text(kEngineKeyFileMaxBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read engine key file " + path, errno);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

}  // namespace

Status CheckEngineKey(std::string_view key) {
  if (key.size() < kEngineKeyMinBytes || key.size() > kEngineKeyMaxBytes) {
    return InvalidArgument("a key of " + std::to_string(key.size()) + " characters (keys have " +
                           std::to_string(kEngineKeyMinBytes) + " to " +
                           std::to_string(kEngineKeyMaxBytes) + ")");
  }
  for (size_t i = 0; i < key.size(); ++i) {
    if (!IsB64TokenChar(key[i])) {
      return InvalidArgument("a key with a character out of A-Z a-z 0-9 - . _ ~ + / = at " +
                             std::to_string(i + 1));
    }
  }
  return OkStatus();
}

Result<std::vector<std::string>> ReadEngineKeyFile(const std::string& path) {
  BATON_ASSIGN_OR_RETURN(const std::string text, ReadKeyFile(path));
  if (text.size() > kEngineKeyFileMaxBytes) {
    return FailedPrecondition("engine key file " + path + " is longer than " +
                              std::to_string(kEngineKeyFileMaxBytes) + " bytes");
  }
  std::vector<std::string> keys;
  std::string_view rest = text;
  for (size_t line = 1; !rest.empty(); ++line) {
    const size_t end = rest.find('\n');
    const std::string_view key = Trimmed(rest.substr(0, end));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    if (key.empty() || key.front() == '#') continue;
    if (Status st = CheckEngineKey(key); !st.ok()) {
      return FailedPrecondition("engine key file " + path + ", line " + std::to_string(line) +
                                ": " + std::string(st.message()));
    }
    keys.emplace_back(key);
  }
  if (keys.empty()) return FailedPrecondition("engine key file " + path + " holds no key");
  return keys;
}

Result<std::vector<std::string>> ParseEngineKeys(std::string_view list) {
  std::vector<std::string> keys;
  if (list.empty()) return keys;
  for (size_t n = 1;; ++n) {
    const size_t comma = list.find(',');
    const std::string_view key = list.substr(0, comma);
    if (Status st = CheckEngineKey(key); !st.ok()) {
      return InvalidArgument(std::string(kEngineKeysEnv) + ", element " + std::to_string(n) + ": " +
                             std::string(st.message()));
    }
    keys.emplace_back(key);
    if (comma == std::string_view::npos) return keys;
    list.remove_prefix(comma + 1);
  }
}

Status CheckEngineKeyFileSetting(std::string_view setting, const std::string& path) {
  if (path.empty() || path.front() != '/') {
    return InvalidArgument(std::string(setting) + ": want an absolute path, got \"" + path + "\"");
  }
  if (Result<std::vector<std::string>> keys = ReadEngineKeyFile(path); !keys.ok()) {
    return InvalidArgument(std::string(setting) + ": " + keys.status().message());
  }
  return OkStatus();
}

std::string JoinEngineKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& key : keys) {
    if (!out.empty()) out += ',';
    out += key;
  }
  return out;
}

bool BearerMatches(const HttpRequest& request, const std::vector<std::string>& keys) {
  auto it = request.find(boost::beast::http::field::authorization);
  if (it == request.end()) return false;
  // The scheme is case-insensitive (RFC 9110, 11.1): "bearer KEY" is as good as "Bearer KEY".
  const std::string_view value(it->value().data(), it->value().size());
  constexpr std::string_view kScheme = "bearer ";
  const std::string_view scheme = value.substr(0, kScheme.size());
  if (!boost::beast::iequals({scheme.data(), scheme.size()}, {kScheme.data(), kScheme.size()}))
    return false;
  const std::string_view given = value.substr(kScheme.size());
  bool matched = false;
  for (const std::string& key : keys) matched |= ConstantTimeEquals(given, key);
  return matched;
}

void RespondEngineKeyMissing(HttpExchange* exchange) {
  exchange->Respond(401, "application/json",
                    HttpErrorJson(401, "missing or wrong engine key (Authorization: Bearer KEY)"),
                    {{"WWW-Authenticate", "Bearer"}});
}

}  // namespace baton
