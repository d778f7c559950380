#include "controller/router/router.h"

#include <boost/asio/post.hpp>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/log.h"
#include "controller/router/upstream_call.h"

namespace baton {
namespace {

namespace http = boost::beast::http;

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

void RouterMetrics::Record(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void RouterMetrics::RecordUpstreamError(const std::string& kind) {
  std::lock_guard<std::mutex> lock(mu_);
  ++upstream_errors_[kind];
}

std::string RouterMetrics::Render(const proto::RouteTable& table, bool connected) const {
  std::ostringstream out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out << "# HELP baton_router_requests_total Requests answered, by route and status.\n"
        << "# TYPE baton_router_requests_total counter\n";
    for (const auto& [key, n] : requests_) {
      out << "baton_router_requests_total{route=\"" << Escape(key.first) << "\",status=\""
          << key.second << "\"} " << n << "\n";
    }
    out << "# HELP baton_router_upstream_errors_total Failed engine calls, by kind.\n"
        << "# TYPE baton_router_upstream_errors_total counter\n";
    for (const auto& [kind, n] : upstream_errors_) {
      out << "baton_router_upstream_errors_total{kind=\"" << Escape(kind) << "\"} " << n << "\n";
    }
  }
  std::string primary;
  uint64_t primary_id = 0;
  for (const proto::RouteEntry& e : table.entries) {
    if (e.role == "primary" && e.ready) {
      primary = e.http_address;
      primary_id = e.engine_id;
    }
  }
  out << "# HELP baton_router_primary The ready primary (1), labelled by engine and address.\n"
      << "# TYPE baton_router_primary gauge\n";
  if (!primary.empty()) {
    out << "baton_router_primary{engine_id=\"" << primary_id << "\",address=\"" << Escape(primary)
        << "\"} 1\n";
  }
  out << "# TYPE baton_router_has_primary gauge\nbaton_router_has_primary "
      << (primary.empty() ? 0 : 1) << "\n"
      << "# TYPE baton_router_route_table_version gauge\nbaton_router_route_table_version "
      << table.version << "\n"
      << "# TYPE baton_router_epoch gauge\nbaton_router_epoch " << table.epoch << "\n"
      << "# TYPE baton_router_controller_connected gauge\nbaton_router_controller_connected "
      << (connected ? 1 : 0) << "\n";
  return out.str();
}

Router::Router(RouterOptions options)
    : options_(std::move(options)), work_(boost::asio::make_work_guard(io_)) {}

Router::~Router() { Stop(); }

Status Router::Start() {
  HttpServerOptions http;
  http.host = options_.listen_host;
  http.port = options_.listen_port;
  http.body_limit = options_.max_body_bytes;
  server_ = std::make_unique<HttpServer>(io_, http);
  for (const char* route : {"/v1/completions", "/v1/chat/completions"}) {
    server_->Route(http::verb::post, route, [this, route](std::shared_ptr<HttpExchange> ex) {
      Forward(route, std::move(ex));
    });
  }
  server_->Route(http::verb::get, "/v1/models", [this](std::shared_ptr<HttpExchange> ex) {
    Forward("/v1/models", std::move(ex));
  });
  server_->Route(http::verb::get, "/health",
                 [this](std::shared_ptr<HttpExchange> ex) { Health(std::move(ex)); });
  server_->Route(http::verb::get, "/metrics",
                 [this](std::shared_ptr<HttpExchange> ex) { Metrics(std::move(ex)); });
  BATON_RETURN_IF_ERROR(server_->Listen());
  if (!options_.backend.empty()) {
    routes_.SetStatic(options_.backend);
    BATON_LOG(INFO, "router") << "static backend " << options_.backend;
  } else {
    routes_.Start(options_.controller_socket, options_.resubscribe_max_backoff);
  }
  for (int i = 0; i < options_.threads; ++i) {
    threads_.emplace_back([this] { io_.run(); });
  }
  BATON_LOG(INFO, "router") << "listening on " << options_.listen_host << ":" << server_->port();
  return OkStatus();
}

void Router::Stop() {
  if (server_ != nullptr && !threads_.empty()) {
    std::promise<void> closed;
    boost::asio::post(io_, [this, &closed] {
      server_->Close();
      closed.set_value();
    });
    closed.get_future().wait();
  }
  routes_.Stop();
  work_.reset();
  io_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

bool Router::Authorized(const HttpExchange& exchange) const {
  if (options_.api_key.empty()) return true;
  const HttpRequest& req = exchange.request();
  auto it = req.find(http::field::authorization);
  if (it == req.end()) return false;
  return ConstantTimeEquals(std::string_view(it->value().data(), it->value().size()),
                            "Bearer " + options_.api_key);
}

void Router::Forward(const std::string& route, std::shared_ptr<HttpExchange> exchange) {
  if (!Authorized(*exchange)) {
    metrics_.Record(route, 401);
    exchange->Respond(401, "application/json",
                      HttpErrorJson(401, "missing or wrong API key (Authorization: Bearer KEY)"),
                      {{"WWW-Authenticate", "Bearer"}});
    return;
  }
  std::optional<std::string> primary = routes_.Primary();
  if (!primary) {
    metrics_.Record(route, 503);
    metrics_.RecordUpstreamError("no_primary");
    exchange->RespondError(503, "no engine is serving now; retry shortly");
    return;
  }
  UpstreamTimeouts timeouts{.connect = options_.connect_timeout,
                            .first_byte = options_.first_byte_timeout,
                            .idle = options_.stream_idle_timeout};
  StartUpstreamCall(io_, *primary, std::move(exchange), timeouts,
                    [this, route](int status, const std::string& error) {
                      metrics_.Record(route, status);
                      if (!error.empty()) metrics_.RecordUpstreamError(error);
                    });
}

void Router::Health(std::shared_ptr<HttpExchange> exchange) {
  std::optional<std::string> primary = routes_.Primary();
  const int status = primary ? 200 : 503;
  metrics_.Record("/health", status);
  nlohmann::json body = {{"status", primary ? "ok" : "no_primary"},
                         {"primary", primary.value_or("")},
                         {"controller_connected", routes_.connected()}};
  exchange->RespondJson(status, body.dump());
}

void Router::Metrics(std::shared_ptr<HttpExchange> exchange) {
  metrics_.Record("/metrics", 200);
  exchange->Respond(200, "text/plain; version=0.0.4",
                    metrics_.Render(routes_.table(), routes_.connected()));
}

}  // namespace baton
