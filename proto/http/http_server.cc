#include "proto/http/http_server.h"

#include <boost/asio/ip/address.hpp>
#include <boost/asio/strand.hpp>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "proto/http/http_connection.h"

namespace baton {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

std::string HttpErrorJson(int status, std::string_view message) {
  nlohmann::ordered_json inner;
  inner["message"] = std::string(message);
  // A client that backs off on 429 looks for OpenAI's rate-limit type and code; one that
  // asks for a new key on 401, for its authentication type and code.
  const bool rate_limited = status == 429;
  const bool unauthorized = status == 401;
  inner["type"] = status >= 500  ? "server_error"
                  : rate_limited ? "rate_limit_error"
                  : unauthorized ? "authentication_error"
                                 : "invalid_request_error";
  inner["param"] = nullptr;
  inner["code"] = rate_limited   ? nlohmann::ordered_json("rate_limit_exceeded")
                  : unauthorized ? nlohmann::ordered_json("invalid_api_key")
                                 : nullptr;
  nlohmann::ordered_json j;
  j["error"] = std::move(inner);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

constexpr std::chrono::milliseconds kAcceptRetry{100};

}  // namespace

HttpServer::HttpServer(net::io_context& io, HttpServerOptions options)
    : io_(io),
      options_(options),
      routes_(std::make_shared<HttpRoutes>()),
      acceptor_(net::make_strand(io)),
      accept_retry_(io) {
  routes_->options = std::move(options);
}

HttpServer::~HttpServer() {
  beast::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
}

void HttpServer::Route(http::verb method, std::string path, HttpHandler handler) {
  routes_->table[std::move(path)].emplace_back(method, std::move(handler));
}

Status HttpServer::Listen() {
  beast::error_code ec;
  tcp::resolver resolver(io_);
  auto results =
      resolver.resolve(options_.host, std::to_string(options_.port), tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    return InvalidArgument("cannot resolve listen address '" + options_.host +
                           "': " + ec.message());
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  if (acceptor_.open(endpoint.protocol(), ec)) return Unavailable(where + ": " + ec.message());
  if (acceptor_.set_option(net::socket_base::reuse_address(true), ec) ||
      acceptor_.bind(endpoint, ec) ||
      acceptor_.listen(net::socket_base::max_listen_connections, ec)) {
    return Unavailable("cannot listen on " + where + ": " + ec.message());
  }
  port_ = acceptor_.local_endpoint(ec).port();
  Accept();
  return OkStatus();
}

void HttpServer::Close() {
  beast::error_code ignored;
  acceptor_.close(ignored);
}

void HttpServer::EndKeepAlive() { routes_->closing.store(true); }

void HttpServer::CloseIdle() { CloseIdleConnections(*routes_); }

size_t HttpServer::connections() const { return routes_->connections.load(); }

void HttpServer::Accept() {
  acceptor_.async_accept(net::make_strand(io_), [this](beast::error_code ec, tcp::socket s) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors, the failure repeats every retry until some close: said once.
      const std::string why =
          ec.message() + "; retrying every " + std::to_string(kAcceptRetry.count()) + " ms";
      if (failed_accepts_++ == 0) {
        BATON_LOG(WARN, "http") << "accept failed: " << why;
      } else {
        BATON_LOG(DEBUG, "http") << "accept failed again: " << why;
      }
      accept_retry_.expires_after(kAcceptRetry);
      accept_retry_.async_wait([this](beast::error_code wait_ec) {
        if (!wait_ec && acceptor_.is_open()) Accept();
      });
      return;
    } else {
      // Small writes (SSE events) go out at once: Nagle's algorithm would hold one back until
      // the previous is acknowledged, and a delayed ACK makes that 40 ms.
      beast::error_code ignored;
      s.set_option(tcp::no_delay(true), ignored);
      if (failed_accepts_ > 0) {
        BATON_LOG(INFO, "http") << "accepting again after " << failed_accepts_ << " failed accepts";
        failed_accepts_ = 0;
      }
      ServeConnection(std::move(s), routes_);
    }
    Accept();
  });
}

std::string_view HttpExchange::path() const {
  std::string_view target(request_.target().data(), request_.target().size());
  return target.substr(0, target.find('?'));
}

void HttpExchange::OnAbort(std::function<void()> fn) {
  MutexLock lock(mu_);
  if (!aborted_.load()) {
    on_abort_ = std::move(fn);
    return;
  }
  lock.Unlock();
  if (fn) fn();
}

void HttpExchange::NotifyAbort() {
  std::function<void()> fn;
  {
    MutexLock lock(mu_);
    aborted_.store(true);
    fn = std::move(on_abort_);
  }
  if (fn) fn();
}

}  // namespace baton
