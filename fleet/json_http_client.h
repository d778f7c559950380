// JsonHttpClient: POSTs JSON to one HTTP/1.1 server and reads a JSON answer, over one
// keep-alive connection, every call bounded by a timeout. It is how Baton speaks to etcd's
// v3 JSON API (fleet/etcd_client.h).
//
// An "https://" endpoint is reached over TLS with the given TlsClientContext
// (fleet/tls_client_context.h): the server's certificate must chain to its CAs and name the
// endpoint's host or IP address, and the client presents its certificate when it has one. A
// TLS failure (a refused certificate, on either side) is Unavailable with the reason, like
// any transport error.
//
// Post() connects when no connection is open (a host name resolved within the timeout too,
// fleet/host_resolver.h), sends, and reads one whole response (at most
// kMaxResponseBytes); on any transport error or timeout the connection is closed and the
// error returned (Unavailable, DeadlineExceeded), and the next call connects again. An answer
// that is not a JSON object, whatever its status, is Unavailable (not the server's API: a
// proxy's page, a broken server). A JSON answer whose status is not 2xx is returned as an
// error carrying the server's message: NotFound for 404, Unavailable for 429 and 5xx (the
// server now, not the request), FailedPrecondition for the others. Every error names the
// endpoint and the path. Not thread-safe: one caller at a time.
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "fleet/tls_client_context.h"

namespace baton {

// OK if `endpoint` is one JsonHttpClient takes: [http://|https://]host:port, the port 1-65535;
// InvalidArgument naming it otherwise (for a configuration's check, before any connection).
Status CheckHttpEndpoint(const std::string& endpoint);

class JsonHttpClient {
 public:
  static constexpr size_t kMaxResponseBytes = 64u << 20;

  // `endpoint`: "host:port" or "http://host:port" (host a name or an IPv4 address), spoken in
  // plain HTTP; or "https://host:port", which needs `tls` (InvalidArgument without it). `tls`
  // is shared, and is not used for a plain endpoint.
  static Result<std::unique_ptr<JsonHttpClient>> Create(
      const std::string& endpoint, std::chrono::milliseconds timeout,
      std::shared_ptr<TlsClientContext> tls = nullptr);
  ~JsonHttpClient();
  JsonHttpClient(const JsonHttpClient&) = delete;
  JsonHttpClient& operator=(const JsonHttpClient&) = delete;

  Result<nlohmann::json> Post(const std::string& path, const nlohmann::json& body);
  const std::string& endpoint() const { return endpoint_; }

 private:
  struct Impl;
  JsonHttpClient(std::string endpoint, std::unique_ptr<Impl> impl);

  std::string endpoint_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton
