// EtcdClient: the part of etcd's v3 API that a Baton fleet uses (keys, prefixes, leases),
// spoken as JSON over HTTP through etcd's gRPC gateway (`/v3/...`), which every etcd v3
// server serves on its client port. No gRPC stack is needed: one Beast connection per
// endpoint (fleet/json_http_client.h).
//
// A call goes to the endpoint that answered last; when it cannot be reached, does not answer
// in time, or answers as no healthy member does (no JSON object, HTTP 429 or 5xx: Unavailable,
// DeadlineExceeded) the next endpoint is tried, each at most once per call. An answer of etcd
// in JSON (an error code, an expired lease) ends the call as it is. Every error about an
// answer names the member and the path it came from.
// A call retried on another endpoint may have been applied by the first one: Put is
// idempotent, a lease granted twice leaves one that expires on its own. A compare-and-put
// retried that way finds the key moved on (by its own first write) and reports a conflict:
// its callers read the key again, as after any conflict.
//
// With `tls` set every member is reached over TLS (fleet/tls_client_context.h): endpoints
// "https://host:port" or "host:port", the server's certificate verified against the CA file
// and the endpoint's host or IP address, the client certificate presented when set. Without
// it, members are reached in plain HTTP. Create() refuses a mix: an "https://" endpoint with
// no CA file, an "http://" one with TLS set.
//
// Keys and values are bytes (base64 on the wire). Thread-safe: calls are serialized.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "fleet/json_http_client.h"
#include "fleet/tls_client_context.h"

namespace baton {

struct EtcdOptions {
  std::vector<std::string> endpoints;       // "host:port", "http://" or "https://host:port"
  std::chrono::milliseconds timeout{1000};  // per request, per endpoint
  TlsClientOptions tls{};                   // empty: plain HTTP
  // Keys per range request of GetPrefix (at least 1): a fleet's records in pages, so that
  // no answer nears JsonHttpClient::kMaxResponseBytes however many nodes there are.
  int64_t range_page = 500;
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;  // 0: none
};

struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;
  int64_t revision = 0;  // the store's revision when it was read
};

// The end of the range of keys that start with `prefix` (etcd's `range_end`).
std::string EtcdPrefixEnd(std::string_view prefix);

class EtcdClient {
 public:
  static Result<std::unique_ptr<EtcdClient>> Create(const EtcdOptions& options);

  // Returns the revision of the write. lease 0: the key outlives every lease.
  Result<int64_t> Put(std::string_view key, std::string_view value, int64_t lease = 0);
  Result<std::optional<EtcdKeyValue>> Get(std::string_view key);
  // Every key under `prefix`, in key order, read in pages of `range_page` keys all at the
  // revision of the first page (one consistent view, as one request would give). Fails when
  // any page does (a revision compacted between pages included: read again).
  Result<EtcdRange> GetPrefix(std::string_view prefix);
  // Return how many keys were deleted.
  Result<int64_t> Delete(std::string_view key);
  Result<int64_t> DeletePrefix(std::string_view prefix);

  // Writes `value` under `key` only while the key's mod revision is `expected_mod_revision`
  // (0: only while the key does not exist), in one etcd transaction (`/v3/kv/txn`). Returns
  // the revision of the write, or nullopt when the key had moved on (nothing written): the
  // caller reads it again and decides anew. lease 0: the key outlives every lease.
  Result<std::optional<int64_t>> CompareAndPut(std::string_view key, std::string_view value,
                                               int64_t expected_mod_revision, int64_t lease = 0);
  // Deletes `key` only while its mod revision is `expected_mod_revision`; false when it had
  // moved on or was gone.
  Result<bool> CompareAndDelete(std::string_view key, int64_t expected_mod_revision);

  // A lease of `ttl` (at least 1 s; etcd may grant more); returns its id.
  Result<int64_t> GrantLease(std::chrono::seconds ttl);
  // Renews the lease; returns the seconds it has left. NotFound when it expired or was revoked.
  Result<int64_t> KeepAlive(int64_t lease);
  Status RevokeLease(int64_t lease);

  // The endpoint calls go to first (the last one that answered).
  std::string endpoint() const;

 private:
  EtcdClient(std::vector<std::unique_ptr<JsonHttpClient>> members, int64_t range_page);
  struct Answer {
    nlohmann::json body;
    std::string where;  // <endpoint><path>: for errors about the answer
  };
  Result<Answer> Call(const std::string& path, const nlohmann::json& body);
  Result<EtcdRange> Range(nlohmann::json body);
  // One transaction: `then` runs when the key's mod revision is `mod_revision`.
  Result<Answer> Txn(std::string_view key, int64_t mod_revision, nlohmann::json then);

  mutable Mutex mu_;
  std::vector<std::unique_ptr<JsonHttpClient>> members_;
  const int64_t range_page_;
  size_t current_ BATON_GUARDED_BY(mu_) = 0;
};

}  // namespace baton
