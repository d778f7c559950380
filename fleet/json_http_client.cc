#include "fleet/json_http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <charconv>
#include <optional>

#include "base/text/json_depth.h"
#include "fleet/host_resolver.h"

namespace baton {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr int kMaxDepth = 64;

struct HostPort {
  std::string host, port;
  bool tls = false;
};

Result<HostPort> ParseEndpoint(std::string endpoint) {
  bool tls = false;
  if (endpoint.rfind("http://", 0) == 0) {
    endpoint.erase(0, 7);
  } else if (endpoint.rfind("https://", 0) == 0) {
    endpoint.erase(0, 8);
    tls = true;
  }
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size() ||
      endpoint.find("://") != std::string::npos) {
    return InvalidArgument("endpoint '" + endpoint + "': want [http://|https://]host:port");
  }
  const std::string port = endpoint.substr(colon + 1);
  uint32_t number = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
  if (ec != std::errc() || end != port.data() + port.size() || number == 0 || number > 65535) {
    return InvalidArgument("endpoint '" + endpoint + "': the port must be 1-65535");
  }
  return HostPort{endpoint.substr(0, colon), port, tls};
}

}  // namespace

Status CheckHttpEndpoint(const std::string& endpoint) { return ParseEndpoint(endpoint).status(); }

struct JsonHttpClient::Impl {
  using TlsStream = beast::ssl_stream<beast::tcp_stream>;

  HostPort where;
  std::unique_ptr<HostResolver> resolver;  // of where's host
  std::chrono::milliseconds timeout;
  std::shared_ptr<TlsClientContext> tls;
  asio::io_context io;
  // At most one is open: `plain` for http, `secure` for https.
  std::optional<beast::tcp_stream> plain;
  std::optional<TlsStream> secure;
  beast::flat_buffer buffer;

  std::string what() const { return where.host + ":" + where.port; }
  bool open() const { return plain.has_value() || secure.has_value(); }
  void Close() {
    plain.reset();
    secure.reset();
  }
  beast::tcp_stream& tcp() { return secure ? beast::get_lowest_layer(*secure) : *plain; }

  // Runs the queued operations to their end (each bounded by the stream's expiry).
  void Run() {
    io.restart();
    io.run();
  }

  Status Connect() {
    BATON_ASSIGN_OR_RETURN(const HostResolver::Endpoints results, resolver->Resolve(timeout));
    beast::error_code ec;
    if (where.tls) {
      secure.emplace(io, tls->native());
      if (Status st = TlsClientContext::PrepareConnection(secure->native_handle(), where.host);
          !st.ok()) {
        Close();
        return st;
      }
    } else {
      plain.emplace(io);
    }
    tcp().expires_after(timeout);
    tcp().async_connect(results, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
    Run();
    if (ec) {
      Close();
      return Unavailable("connect " + what() + ": " + ec.message());
    }
    if (where.tls) {
      tcp().expires_after(timeout);
      secure->async_handshake(asio::ssl::stream_base::client, [&](beast::error_code e) { ec = e; });
      Run();
      if (ec) {
        std::string why = ec.message();
        if (const std::string refused = TlsClientContext::VerifyFailure(secure->native_handle());
            !refused.empty()) {
          why = "the server's certificate is refused: " + refused;
        }
        Close();
        const std::string message = "TLS handshake " + what() + ": " + why;
        if (ec == beast::error::timeout) return DeadlineExceeded(message);
        return Unavailable(message);
      }
    }
    buffer.clear();
    return OkStatus();
  }

  template <class Stream>
  beast::error_code Transfer(Stream& stream, const http::request<http::string_body>& req,
                             http::response_parser<http::string_body>* parser) {
    beast::error_code ec;
    http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
    Run();
    if (!ec) {
      http::async_read(stream, buffer, *parser, [&](beast::error_code e, size_t) { ec = e; });
      Run();
    }
    return ec;
  }

  Result<http::response<http::string_body>> Exchange(const http::request<http::string_body>& req) {
    if (!open()) BATON_RETURN_IF_ERROR(Connect());
    tcp().expires_after(timeout);
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxResponseBytes);
    const beast::error_code ec =
        secure ? Transfer(*secure, req, &parser) : Transfer(*plain, req, &parser);
    if (ec) {
      Close();
      // With TLS 1.3 a server that refuses this client's certificate says so on the first read.
      std::string detail = ec.message();
      if (ec.category() == asio::error::get_ssl_category()) {
        detail = "TLS: " + detail;
        if (tls->options().cert_file.empty()) {
          detail += " (this client presents no certificate; the server may require one)";
        }
      }
      if (ec == beast::error::timeout) return DeadlineExceeded(what() + ": " + detail);
      return Unavailable(what() + ": " + detail);
    }
    http::response<http::string_body> res = parser.release();
    if (!res.keep_alive()) Close();
    return res;
  }
};

JsonHttpClient::JsonHttpClient(std::string endpoint, std::unique_ptr<Impl> impl)
    : endpoint_(std::move(endpoint)), impl_(std::move(impl)) {}
JsonHttpClient::~JsonHttpClient() = default;

Result<std::unique_ptr<JsonHttpClient>> JsonHttpClient::Create(
    const std::string& endpoint, std::chrono::milliseconds timeout,
    std::shared_ptr<TlsClientContext> tls) {
  BATON_ASSIGN_OR_RETURN(HostPort where, ParseEndpoint(endpoint));
  if (where.tls && tls == nullptr) {
    return InvalidArgument("endpoint " + endpoint +
                           ": https needs a CA file to verify the server's certificate");
  }
  auto impl = std::make_unique<Impl>();
  impl->where = std::move(where);
  impl->resolver = std::make_unique<HostResolver>(impl->where.host, impl->where.port);
  impl->timeout = timeout;
  if (impl->where.tls) impl->tls = std::move(tls);
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
  const std::string where = endpoint_ + path + ": HTTP " + std::to_string(status);
  if (j.is_discarded() || !j.is_object()) {
    // Not the server's JSON API (a proxy's page, a broken member): another member may answer.
    return Unavailable(where + ": the answer is not a JSON object: " + text.substr(0, 300));
  }
  if (status < 200 || status >= 300) {
    std::string message = text.substr(0, 300);
    if (j.contains("message") && j["message"].is_string()) {
      message = j["message"].get<std::string>();
    } else if (j.contains("error") && j["error"].is_string()) {
      message = j["error"].get<std::string>();
    }
    const std::string what = where + ": " + message;
    if (status == 404) return NotFound(what);
    // Overloaded (429) or failing (5xx): this member now, not the request.
    return status == 429 || status >= 500 ? Unavailable(what) : FailedPrecondition(what);
  }
  return j;
}

}  // namespace baton
