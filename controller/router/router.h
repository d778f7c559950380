// Router: baton-router's HTTP front door. Forwards the OpenAI API to the current primary.
//
// Routes: POST /v1/completions and /v1/chat/completions and GET /v1/models go to the ready
// primary of the route table (UpstreamCall), with the body unchanged and streams relayed as
// they arrive; GET /health (200 with a primary, 503 without) and GET /metrics (Prometheus
// text) are answered here. With an API key set, /v1/* wants `Authorization: Bearer KEY`
// (401 otherwise). No primary: 503. The route table comes from the controller
// (RouteSubscriber) or is one static backend.
//
// Ownership: owns the io_context, its threads, the HTTP server and the subscriber.
// Thread: Start() and Stop() from one owning thread; handlers run on the io_context threads.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "controller/router/route_subscriber.h"
#include "controller/router/router_options.h"
#include "standby/http_server.h"

namespace baton {

// Counters for /metrics. Thread-safe.
class RouterMetrics {
 public:
  void Record(const std::string& route, int status);
  void RecordUpstreamError(const std::string& kind);
  std::string Render(const proto::RouteTable& table, bool controller_connected) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> upstream_errors_;
};

class Router {
 public:
  explicit Router(RouterOptions options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Binds the listen address, starts the route table and the io_context threads.
  Status Start();
  void Stop();

  uint16_t port() const { return server_ ? server_->port() : 0; }
  const RouteSubscriber& routes() const { return routes_; }

 private:
  void Forward(const std::string& route, std::shared_ptr<HttpExchange> exchange);
  void Health(std::shared_ptr<HttpExchange> exchange);
  void Metrics(std::shared_ptr<HttpExchange> exchange);
  bool Authorized(const HttpExchange& exchange) const;

  RouterOptions options_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::unique_ptr<HttpServer> server_;
  RouteSubscriber routes_;
  RouterMetrics metrics_;
  std::vector<std::thread> threads_;
};

}  // namespace baton
