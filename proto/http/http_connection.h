// Internal to the HTTP server (proto/http/http_server.h): the route table every connection
// shares, and serving one accepted socket.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "proto/http/http_server.h"

namespace baton {

struct HttpRoutes {
  HttpServerOptions options;
  std::map<std::string, std::vector<std::pair<boost::beast::http::verb, HttpHandler>>, std::less<>>
      table;
  mutable std::atomic<size_t> connections{0};
  // Set by HttpServer::EndKeepAlive(): every response from then on closes its connection.
  mutable std::atomic<bool> closing{false};
  // The open connections, for CloseIdle(); each one registers as it starts serving.
  mutable Mutex live_mu;
  mutable std::map<const HttpConnection*, std::weak_ptr<HttpConnection>> live
      BATON_GUARDED_BY(live_mu);

  void Count(int status) const {
    if (options.on_response) options.on_response(status);
  }
  void CountOwn(int status) const {
    if (options.on_server_response) options.on_server_response(status);
  }
};

// Serves `socket` on its own strand until it closes: reads requests, hands each to its route
// as an HttpExchange and writes the answer. Past `max_connections` open connections it
// answers 503 and closes instead.
void ServeConnection(boost::asio::ip::tcp::socket socket, std::shared_ptr<const HttpRoutes> routes);

// Closes every registered connection that waits for a request and has received no byte of
// one; the others close after their current response (once `closing` is set).
void CloseIdleConnections(const HttpRoutes& routes);

}  // namespace baton
