// HttpServer: a small HTTP/1.1 server on Boost.Beast, the front that the router and the
// reference engine serve their clients with (it knows neither of them).
//
// Each connection reads one request at a time, with keep-alive (the next request is read
// once the previous response is written), a body limit (413), a header limit (431), an idle
// timeout between requests, a request timeout from a request's first byte to its last (408:
// a slow, slowloris-style client cannot hold a connection), a connection limit (503), and
// `Expect: 100-continue`. A request goes to the handler routed by its exact
// path and method: an unknown path gets 404, a known path with another method 405 (with
// Allow), a malformed request 400; these errors are OpenAI-shaped JSON
// ({"error": {"message", "type", "param", "code"}}). A handler answers through its
// HttpExchange, at once or later and from any thread: one full response, or a chunked
// stream (BeginStream, Write per chunk, EndStream), each chunk written as soon as it comes.
//
// Threads: the acceptor and the connections run on the io_context's threads, each
// connection on its own strand; handlers are called on that strand. HttpExchange's methods
// are thread-safe. Routes are set before Listen(). A connection outlives the server object
// only until its current exchange ends or the io_context stops.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/verb.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace baton {

class HttpConnection;
struct HttpRoutes;

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// The JSON body of an error response, OpenAI-shaped: {"error": {"message", "type", "param",
// "code"}}; type server_error from 500, rate_limit_error (code rate_limit_exceeded) for 429,
// invalid_request_error otherwise.
std::string HttpErrorJson(int status, std::string_view message);

class HttpExchange {
 public:
  ~HttpExchange();  // an exchange dropped unanswered gets a 500
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const HttpRequest& request() const { return request_; }
  // The target without its query string.
  std::string_view path() const;

  // One full response; the exchange ends once it is written.
  void Respond(int status, std::string content_type, std::string body, HttpHeaders headers = {});
  void RespondJson(int status, std::string body) {
    Respond(status, "application/json", std::move(body));
  }
  void RespondError(int status, std::string_view message) {
    RespondJson(status, HttpErrorJson(status, message));
  }
  // A chunked response: the header now, then one chunk per Write, then the end.
  void BeginStream(int status, std::string content_type, HttpHeaders headers = {});
  void Write(std::string chunk);
  void EndStream();

  // `fn` runs (on the connection's strand) if the connection fails before the exchange
  // ends: the client went away. Runs at once when that already happened.
  void OnAbort(std::function<void()> fn);
  bool aborted() const { return aborted_.load(); }

 private:
  friend class HttpConnection;
  HttpExchange(std::shared_ptr<HttpConnection> connection, uint64_t seq, HttpRequest request);
  void NotifyAbort();

  std::shared_ptr<HttpConnection> connection_;
  const uint64_t seq_;
  const HttpRequest request_;
  std::atomic<bool> answered_{false};
  std::atomic<bool> aborted_{false};
  Mutex mu_;
  std::function<void()> on_abort_ BATON_GUARDED_BY(mu_);
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port
  size_t body_limit = 1u << 20;
  uint32_t header_limit = 16u << 10;
  std::chrono::milliseconds idle_timeout{120000};    // waiting for a request on a connection
  std::chrono::milliseconds request_timeout{30000};  // a request's first byte to its end: 408
  std::chrono::milliseconds write_timeout{60000};    // each write of a response
  size_t max_connections = 0;  // 0: no limit; past it a new connection gets 503 and is closed
  std::function<void(int status)> on_response;  // every response's status (for metrics)
  // Also called, besides on_response, for each response the server makes itself, with no
  // handler's answer: a malformed request (400), no route (404), a wrong method (405), 408,
  // 413, 431, the 503 past max_connections, and 500 for a handler that threw or dropped its
  // exchange. A server that counts its handlers' answers itself counts these here.
  std::function<void(int status)> on_server_response;
};

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& io, HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void Route(boost::beast::http::verb method, std::string path, HttpHandler handler);
  // Binds and starts accepting.
  Status Listen();
  uint16_t port() const { return port_; }
  const std::string& host() const { return options_.host; }
  // Stops accepting; call it on the io_context's thread (or before it runs). Open
  // connections run until the io_context stops.
  void Close();

  // Draining (a server about to stop without cutting a request): EndKeepAlive() makes every
  // response from now on close its connection (Connection: close); CloseIdle() closes the
  // connections that wait for a request of which no byte has arrived. Any thread.
  void EndKeepAlive();
  void CloseIdle();
  // Client connections open now (a closing one counts until its socket is closed).
  size_t connections() const;

 private:
  void Accept();

  boost::asio::io_context& io_;
  HttpServerOptions options_;
  std::shared_ptr<HttpRoutes> routes_;
  boost::asio::ip::tcp::acceptor acceptor_;
  // After a failed accept (out of fds: the connection stays queued and would fail again at
  // once), the next one waits kAcceptRetry instead of spinning.
  boost::asio::steady_timer accept_retry_;
  uint64_t failed_accepts_ = 0;  // in a row: the first is logged, then their end
  uint16_t port_ = 0;
};

}  // namespace baton
