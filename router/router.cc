#include "router/router.h"

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/build_info.h"
#include "base/log.h"
#include "base/text/json_depth.h"
#include "fleet/plaintext_etcd.h"
#include "proto/http/engine_key.h"
#include "router/upstream/relayed_request.h"

namespace baton {
namespace {

namespace http = boost::beast::http;

constexpr std::chrono::milliseconds kTickInterval{5};
constexpr std::chrono::seconds kPruneInterval{1};

std::set<uint64_t> ListedEngines(const proto::RouteTable& table) {
  std::set<uint64_t> ids;
  for (const proto::RouteEntry& e : table.entries) ids.insert(e.engine_id);
  return ids;
}

UpstreamTimeouts TimeoutsFrom(const RouterOptions& o) {
  return {.connect = o.connect_timeout,
          .first_byte = o.first_byte_timeout,
          .idle = o.stream_idle_timeout};
}

AdmissionOptions AdmissionFrom(const RouterOptions& o) {
  return {.max_queue = o.max_queue,
          .max_queue_wait = o.max_queue_wait,
          .ramp_steps = o.ramp_steps,
          .ramp_duration = o.ramp_duration};
}

}  // namespace

Router::Router(RouterOptions options, const Clock& clock)
    : options_(std::move(options)),
      clock_(clock),
      work_(boost::asio::make_work_guard(io_)),
      tick_(io_),
      admission_(clock_, AdmissionFrom(options_)),
      fleet_(options_.etcd.empty() ? nullptr
                                   : std::make_unique<FleetAdmission>(
                                         clock_, AdmissionFrom(options_), options_.fleet_suspect)),
      plaintext_etcd_(PlaintextRemoteEndpoints(options_.etcd, !options_.etcd_ca_file.empty())),
      pool_(clock_),
      api_keys_(options_.api_key.empty() ? std::vector<std::string>()
                                         : std::vector<std::string>{options_.api_key}),
      engine_key_(options_.engine_key_file),
      shadow_(io_.get_executor(), options_.shadow_every, TimeoutsFrom(options_), admitter(),
              &outcomes_, &pool_, options_.engine_key_file.empty() ? nullptr : &engine_key_) {}

Router::~Router() { Stop(); }

Status Router::Start() {
  BATON_RETURN_IF_ERROR(engine_key_.Load());
  HttpServerOptions http;
  http.host = options_.listen_host;
  http.port = options_.listen_port;
  http.body_limit = options_.max_body_bytes;
  http.header_limit = options_.max_header_bytes;
  http.idle_timeout = options_.client_idle_timeout;
  http.request_timeout = options_.request_timeout;
  http.max_connections = options_.max_connections;
  // The HTTP layer's own answers (404, 405, 400, 408, 413, 431, 503 past max_connections)
  // reach no route handler, which counts the others.
  http.on_server_response = [this](int status) { metrics_.Record("none", status); };
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
  if (fleet_) {
    BATON_RETURN_IF_ERROR(StartFleet());
  } else {
    StartRoutes();
  }
  ScheduleTick();
  for (int i = 0; i < options_.threads; ++i) {
    threads_.emplace_back([this] { Run(); });
  }
  BATON_LOG(INFO, "router") << "listening on " << options_.listen_host << ":" << server_->port();
  if (!options_.engine_key_file.empty()) {
    BATON_LOG(INFO, "router") << "engines get the first key of " << options_.engine_key_file
                              << " (read again on SIGHUP)";
  }
  if (options_.stall_timeout.count() != 0 &&
      options_.stall_timeout >= options_.stream_idle_timeout) {
    BATON_LOG(WARN, "router") << "stall_timeout_ms " << options_.stall_timeout.count()
                              << " is not below stream_idle_timeout_ms "
                              << options_.stream_idle_timeout.count()
                              << ": a stream is cut before its engine is found stalled";
  }
  return OkStatus();
}

void Router::StartRoutes() {
  routes_.OnChange([this](const proto::RouteTable& table) {
    admission_.SetTable(table);
    outcomes_.SetListed({{"", ListedEngines(table)}}, clock_.Now());
  });
  routes_.OnReport([this] { return outcomes_.Snapshot(); });
  routes_.OnStall([this] { return std::move(Stalls()[""]); });
  routes_.OnNewController([this] { admission_.ControllerRestarted(); });
  if (!options_.backend.empty()) {
    routes_.SetStatic(options_.backend);
    BATON_LOG(INFO, "router") << "static backend " << options_.backend;
  } else {
    routes_.Start(options_.controller_socket, options_.resubscribe_max_backoff);
  }
}

std::map<std::string, std::vector<proto::EngineStalled>> Router::Stalls() {
  const TimePoint now = clock_.Now();
  const TimePoint ticked{std::chrono::nanoseconds(last_tick_ns_.load())};
  if (options_.stall_timeout.count() == 0 || now - ticked > std::chrono::seconds(1)) {
    stalls_.Reset();
    return {};
  }
  StallTracker::Confirmed confirmed =
      stalls_.Confirm(progress_.Stalled(now, options_.stall_timeout));
  for (const EngineProgress::Stall& s : confirmed.first) {
    metrics_.RecordEngineStall();
    BATON_LOG(WARN, "router")
        << "engine " << s.engine_id << (s.node.empty() ? "" : " of node " + s.node)
        << " sent nothing on its " << s.streams << " answering streams for "
        << std::chrono::duration_cast<std::chrono::milliseconds>(s.quiet).count()
        << " ms: reported stalled to "
        << (s.node.empty() ? "the controller" : "its node's controller");
  }
  return std::move(confirmed.by_node);
}

void Router::PruneOutcomes(TimePoint now) {
  if (options_.engine_retention.count() == 0 || now - last_prune_ < kPruneInterval) return;
  last_prune_ = now;
  if (fleet_) (void)fleet_->Forget(now, options_.engine_retention);
  const size_t pruned = outcomes_.Prune(now, options_.engine_retention);
  if (pruned == 0) return;
  BATON_LOG(INFO, "router") << "forgot the outcomes of " << pruned << " engines unlisted for "
                            << options_.engine_retention.count()
                            << " ms: they leave the reports and /metrics";
}

Status Router::StartFleet() {
  std::string name = options_.fleet_router_name;
  if (name.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    name = std::string(host) + "-" + std::to_string(::getpid());
  }
  if (!plaintext_etcd_.empty()) BATON_LOG(WARN, "router") << PlaintextEtcdWarning(plaintext_etcd_);
  FleetViewOptions view;
  view.etcd.endpoints = options_.etcd;
  view.etcd.timeout = options_.etcd_timeout;
  view.etcd.tls = {.ca_file = options_.etcd_ca_file,
                   .cert_file = options_.etcd_cert_file,
                   .key_file = options_.etcd_key_file};
  view.prefix = options_.etcd_prefix;
  view.poll = options_.fleet_poll;
  view.router = std::move(name);
  BATON_ASSIGN_OR_RETURN(view_, FleetView::Create(std::move(view)));
  view_->OnChange([this](const std::vector<FleetNode>& nodes) {
    fleet_->SetNodes(nodes);
    EngineOutcomes::Listing listed;
    for (const FleetNode& n : nodes) listed[n.name] = ListedEngines(n.routes);
    outcomes_.SetListed(listed, clock_.Now());
  });
  view_->OnReport([this] {
    FleetView::Reports reports;
    for (const std::string& node : outcomes_.Nodes()) {
      reports[node].engines = outcomes_.Snapshot(node);
    }
    for (auto& [node, stalls] : Stalls()) reports[node].stalls = std::move(stalls);
    return reports;
  });
  view_->Start();
  return OkStatus();
}

void Router::Run() {
  for (;;) {
    try {
      io_.run();
      return;
    } catch (const std::exception& e) {
      // One request's handler failed; the others, and the router, keep going.
      BATON_LOG(ERROR, "router") << "a request handler threw: " << e.what();
    }
  }
}

void Router::ScheduleTick() {
  tick_.expires_after(kTickInterval);
  tick_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    const TimePoint now = clock_.Now();
    last_tick_ns_ =
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
    admission_.Tick();
    PruneOutcomes(now);
    if (fleet_) fleet_->Tick();
    ScheduleTick();
  });
}

void Router::Stop() {
  if (server_ != nullptr && !threads_.empty()) {
    std::promise<void> closed;
    boost::asio::post(io_, [this, &closed] {
      server_->Close();
      tick_.cancel();
      closed.set_value();
    });
    closed.get_future().wait();
  }
  routes_.Stop();
  if (view_) view_->Stop();
  work_.reset();
  io_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void Router::StartServiceWatchdog(SdNotifier notifier) {
  watchdog_ = std::make_unique<ServiceWatchdog>(io_, std::move(notifier), clock_, "router");
  boost::asio::post(watchdog_->executor(), [w = watchdog_.get()] { w->Start("listening"); });
}

void Router::BeginDrain() {
  if (draining_.exchange(true) || server_ == nullptr) return;
  if (watchdog_ != nullptr) {
    // STOPPING=1 from the io loop, which owns the watchdog's timer; a loop that does not run
    // it within a second (stuck: what the watchdog is for) does not hold the drain back.
    auto stopped = std::make_shared<std::promise<void>>();
    std::future<void> done = stopped->get_future();
    boost::asio::post(watchdog_->executor(), [this, stopped] {
      watchdog_->Stopping();
      stopped->set_value();
    });
    (void)done.wait_for(std::chrono::seconds(1));
  }
  server_->EndKeepAlive();
  BATON_LOG(INFO, "router") << "draining: /health says so, responses close their connections; "
                            << connections() << " client connections open, "
                            << (fleet_ ? fleet_->in_flight() : admission_.in_flight())
                            << " requests on engines, "
                            << (fleet_ ? fleet_->queued() : admission_.queued()) << " queued";
}

void Router::StopAccepting() {
  if (server_ == nullptr || threads_.empty()) return;
  std::promise<void> closed;
  boost::asio::post(io_, [this, &closed] {
    server_->Close();
    closed.set_value();
  });
  closed.get_future().wait();
  server_->CloseIdle();
  BATON_LOG(INFO, "router") << "draining: no new connections; waiting for " << connections()
                            << " open ones";
}

void Router::CloseIdle() {
  if (server_ != nullptr) server_->CloseIdle();
}

bool Router::Idle() const { return connections() == 0; }

bool Router::Authorized(const HttpExchange& exchange) const {
  return api_keys_.empty() || BearerMatches(exchange.request(), api_keys_);
}

Status Router::ReloadEngineKey() {
  if (options_.engine_key_file.empty()) {
    BATON_LOG(INFO, "router") << "SIGHUP: no engine_key_file to read again";
    return OkStatus();
  }
  if (Status st = engine_key_.Load(); !st.ok()) {
    BATON_LOG(WARN, "router") << "SIGHUP: " << st.message() << ": engines still get the key sent "
                              << "so far";
    return st;
  }
  BATON_LOG(INFO, "router") << "SIGHUP: engine key file " << options_.engine_key_file
                            << " read again: engines get its first key from now on";
  return OkStatus();
}

void Router::Forward(const std::string& route, std::shared_ptr<HttpExchange> exchange) {
  if (!Authorized(*exchange)) {
    metrics_.Record(route, 401);
    exchange->Respond(401, "application/json",
                      HttpErrorJson(401, "missing or wrong API key (Authorization: Bearer KEY)"),
                      {{"WWW-Authenticate", "Bearer"}});
    return;
  }
  if (JsonNestingDepth(exchange->request().body()) > kMaxJsonDepth) {
    metrics_.Record(route, 400);
    exchange->Respond(400, "application/json",
                      HttpErrorJson(400, "the request body nests deeper than " +
                                             std::to_string(kMaxJsonDepth) + " levels"));
    return;
  }
  RelayDeps deps{.admission = admitter(),
                 .metrics = &metrics_,
                 .clock = &clock_,
                 .timeouts = TimeoutsFrom(options_),
                 .migration_limit = options_.migration_limit,
                 .unreachable_limit = options_.max_queue_wait,
                 .pool = &pool_,
                 .outcomes = &outcomes_,
                 .shadow = &shadow_,
                 .progress = &progress_,
                 .engine_key = options_.engine_key_file.empty() ? nullptr : &engine_key_};
  std::make_shared<RelayedRequest>(boost::asio::make_strand(io_), route, std::move(exchange), deps)
      ->Start();
}

void Router::Health(std::shared_ptr<HttpExchange> exchange) {
  std::optional<std::string> primary = routes_.Primary();
  if (fleet_) {
    std::optional<Target> any = fleet_->AnyPrimary();
    primary = any ? std::optional<std::string>(any->address) : std::nullopt;
  }
  const bool draining = draining_.load();
  const int status = primary && !draining ? 200 : 503;
  // Drained by its operator (`batonctl drain`): no primary comes back by itself.
  const bool out_of_service = fleet_ ? fleet_->OutOfService("") : admission_.OutOfService();
  metrics_.Record("/health", status);
  nlohmann::json body = {{"status", draining         ? "draining"
                                    : primary        ? "ok"
                                    : out_of_service ? "out_of_service"
                                                     : "no_primary"},
                         {"primary", primary.value_or("")},
                         {"queued", fleet_ ? fleet_->queued() : admission_.queued()},
                         {"in_flight", fleet_ ? fleet_->in_flight() : admission_.in_flight()}};
  // A fleet's router follows etcd, not a controller: its "fleet" object says how etcd answers.
  if (fleet_) {
    body["fleet"] = FleetHealth();
  } else {
    body["controller_connected"] = routes_.connected();
  }
  exchange->RespondJson(status,
                        body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

nlohmann::json Router::FleetHealth() const {
  const FleetViewState view = view_->state();
  nlohmann::json nodes = nlohmann::json::array();
  for (const FleetNodeView& n : fleet_->Nodes()) {
    nodes.push_back({{"node", n.name},
                     {"model", n.model},
                     {"listed", n.listed},
                     {"suspect", n.suspect},
                     {"out_of_service", n.out_of_service},
                     {"primary", n.primary ? n.primary->address : ""},
                     {"in_flight", n.in_flight},
                     {"queued", n.queued},
                     {"load", n.load}});
  }
  return {{"etcd_connected", view.etcd_connected},
          {"etcd_error", view.last_error},
          {"etcd_plaintext", plaintext_etcd_},
          {"nodes", nodes}};
}

RouterGauges Router::FleetGauges() const {
  RouterGauges g{.controller_connected = false,
                 .queued = fleet_->queued(),
                 .in_flight = fleet_->in_flight(),
                 .failovers = fleet_->failovers(),
                 .weights = fleet_->Weights(),
                 .shadows = shadow_.stats(),
                 .fleet = true,
                 .fleet_nodes = fleet_->Nodes(),
                 .fleet_view = view_->state()};
  if (std::optional<Target> any = fleet_->AnyPrimary()) {
    g.table.entries.push_back({.engine_id = any->engine_id,
                               .role = proto::EngineRole::kPrimary,
                               .http_address = any->address,
                               .ready = true});
  }
  for (const std::string& node : outcomes_.Nodes()) {
    for (const proto::EngineOutcome& o : outcomes_.Snapshot(node)) {
      g.fleet_outcomes.emplace_back(node, o);
    }
  }
  return g;
}

void Router::Metrics(std::shared_ptr<HttpExchange> exchange) {
  metrics_.Record("/metrics", 200);
  if (fleet_) {
    exchange->Respond(200, "text/plain; version=0.0.4",
                      metrics_.Render(FleetGauges()) + ProcessMetrics());
    return;
  }
  RouterGauges g{.table = routes_.table(),
                 .controller_connected = routes_.connected(),
                 .queued = admission_.queued(),
                 .in_flight = admission_.in_flight(),
                 .failovers = admission_.failovers(),
                 .weights = admission_.Weights(),
                 .outcomes = outcomes_.Snapshot(),
                 .shadows = shadow_.stats()};
  exchange->Respond(200, "text/plain; version=0.0.4", metrics_.Render(g) + ProcessMetrics());
}

std::string Router::ProcessMetrics() const {
  return "# HELP baton_router_draining 1 while the router drains before it stops\n"
         "# TYPE baton_router_draining gauge\nbaton_router_draining " +
         std::string(draining_.load() ? "1" : "0") + "\n" + ProcessInfoMetrics("baton-router");
}

}  // namespace baton
