#include "fleet/json_http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <optional>

#include "base/text/json_depth.h"

namespace baton {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr int kMaxDepth = 64;

struct HostPort {
  std::string host, port;
};

Result<HostPort> ParseEndpoint(std::string endpoint) {
  if (endpoint.rfind("http://", 0) == 0) endpoint.erase(0, 7);
  if (endpoint.rfind("https://", 0) == 0) {
    return InvalidArgument("endpoint " + endpoint + ": TLS is not supported by this client");
  }
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size()) {
    return InvalidArgument("endpoint '" + endpoint + "': want host:port");
  }
  return HostPort{endpoint.substr(0, colon), endpoint.substr(colon + 1)};
}

}  // namespace

struct JsonHttpClient::Impl {
  HostPort where;
  std::chrono::milliseconds timeout;
  asio::io_context io;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  // Runs the queued operations to their end (each bounded by the stream's expiry).
  void Run() {
    io.restart();
    io.run();
  }

  Status Connect() {
    beast::error_code ec;
    tcp::resolver resolver(io);
    const auto results = resolver.resolve(where.host, where.port, ec);
    if (ec) return Unavailable("resolve " + where.host + ": " + ec.message());
    stream.emplace(io);
    stream->expires_after(timeout);
    stream->async_connect(results, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
    Run();
    if (ec) {
      stream.reset();
      return Unavailable("connect " + where.host + ":" + where.port + ": " + ec.message());
    }
    buffer.clear();
    return OkStatus();
  }

  Result<http::response<http::string_body>> Exchange(const http::request<http::string_body>& req) {
    if (!stream) BATON_RETURN_IF_ERROR(Connect());
    beast::error_code ec;
    stream->expires_after(timeout);
    http::async_write(*stream, req, [&](beast::error_code e, size_t) { ec = e; });
    Run();
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxResponseBytes);
    if (!ec) {
      http::async_read(*stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
      Run();
    }
    if (ec) {
      stream.reset();
      const std::string what = where.host + ":" + where.port + ": " + ec.message();
      if (ec == beast::error::timeout) return DeadlineExceeded(what);
      return Unavailable(what);
    }
    http::response<http::string_body> res = parser.release();
    if (!res.keep_alive()) stream.reset();
    return res;
  }
};

JsonHttpClient::JsonHttpClient(std::string endpoint, std::unique_ptr<Impl> impl)
    : endpoint_(std::move(endpoint)), impl_(std::move(impl)) {}
JsonHttpClient::~JsonHttpClient() = default;

Result<std::unique_ptr<JsonHttpClient>> JsonHttpClient::Create(const std::string& endpoint,
                                                               std::chrono::milliseconds timeout) {
  BATON_ASSIGN_OR_RETURN(HostPort where, ParseEndpoint(endpoint));
  auto impl = std::make_unique<Impl>();
  impl->where = std::move(where);
  impl->timeout = timeout;
  return std::unique_ptr<JsonHttpClient>(new JsonHttpClient(endpoint, std::move(impl)));
}

Result<nlohmann::json> JsonHttpClient::Post(const std::string& path, const nlohmann::json& body) {
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, impl_->where.host + ":" + impl_->where.port);
  req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = body.dump();
  req.prepare_payload();
  BATON_ASSIGN_OR_RETURN(http::response<http::string_body> res, impl_->Exchange(req));
  const std::string& text = res.body();
  nlohmann::json j = JsonNestingDepth(text) > kMaxDepth
                         ? nlohmann::json()
                         : nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const unsigned status = res.result_int();
  if (status < 200 || status >= 300) {
    std::string message = text.substr(0, 300);
    if (j.is_object() && j.contains("message") && j["message"].is_string()) {
      message = j["message"].get<std::string>();
    } else if (j.is_object() && j.contains("error") && j["error"].is_string()) {
      message = j["error"].get<std::string>();
    }
    const std::string what = endpoint_ + path + ": HTTP " + std::to_string(status) + ": " + message;
    if (status == 404) return NotFound(what);
    return status >= 500 ? Unavailable(what) : FailedPrecondition(what);
  }
  if (j.is_discarded() || !j.is_object()) {
    return Internal(endpoint_ + path + ": the answer is not a JSON object");
  }
  return j;
}

}  // namespace baton
