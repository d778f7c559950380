// Router: baton-router's HTTP front door (docs/architecture.md, Lossless requests;
// docs/router.md).
//
// Routes: POST /v1/completions and /v1/chat/completions and GET /v1/models go to an engine
// chosen by Admission from the route table, each as a RelayedRequest (queued while no engine
// is ready, replayed on the next engine when its engine fails, streams relayed event by
// event, each attempt's end counted by engine in EngineOutcomes and reported to the
// controller, a canary's reproducible answers compared with the primary's by the
// ShadowComparer; an engine whose answering streams all stand still for stall_timeout is
// reported to the controller as stalled, EngineProgress); GET /health (200 with a primary, 503
// without) and GET /metrics (Prometheus text) are answered here. With an API key set, /v1/* wants
// `Authorization: Bearer KEY` (401 otherwise); with an engine key file, every request to an
// engine carries its first key (EngineKeySource), and an engine's 401 is a failed attempt. Client
// limits (body, header, connections, idle and request timeouts) are the HttpServer's. The route
// table comes from the controller (RouteSubscriber) or is one static backend; with etcd set, the
// router follows the whole fleet instead (FleetView, FleetAdmission: docs/fleet.md) and reports
// what it saw of each node's engines there. An engine that no route table has listed for
// engine_retention, with nothing in flight on it, leaves the outcomes (EngineOutcomes, Pruning), so
// that neither the reports nor /metrics grow with every engine ever seen.
//
// Stopping without losing a request (SIGTERM; docs/router.md, Stopping): BeginDrain() makes
// /health answer 503 "draining" (so that a load balancer takes the router out) and every
// response close its connection; StopAccepting() then closes the listener and the idle
// connections; the requests in flight (queued ones too) finish or are replayed as usual, and
// Idle() turns true once no client connection is left. Stop() ends everything at once.
//
// Ownership: owns the io_context, its threads, the HTTP server, the subscriber and the
// admission state. Thread: Start() and Stop() from one owning thread; handlers run on the
// io_context threads.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/io/sd_notify.h"
#include "base/io/service_watchdog.h"
#include "base/status.h"
#include "proto/http/http_server.h"
#include "router/admission.h"
#include "router/canary/engine_outcomes.h"
#include "router/canary/engine_progress.h"
#include "router/canary/shadow_comparer.h"
#include "router/canary/stall_tracker.h"
#include "router/fleet/fleet_admission.h"
#include "router/fleet/fleet_view.h"
#include "router/route_subscriber.h"
#include "router/router_metrics.h"
#include "router/router_options.h"
#include "router/upstream/engine_key_source.h"
#include "router/upstream/upstream_pool.h"

namespace baton {

class Router {
 public:
  // `clock` drives queue waits and the ramp; it must outlive the router.
  explicit Router(RouterOptions options, const Clock& clock = RealClock::Get());
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Binds the listen address, starts the route table and the io_context threads.
  Status Start();
  // READY=1 to the service manager, then WATCHDOG=1 from the io loop every 100 ms
  // (ServiceWatchdog); once, after Start(). BeginDrain() sends STOPPING=1.
  void StartServiceWatchdog(SdNotifier notifier);
  void Stop();
  // Draining (above); any thread.
  void BeginDrain();
  void StopAccepting();
  // Closes the client connections that wait for a request now (StopAccepting does it once; a
  // connection between two requests then may start waiting after it).
  void CloseIdle();
  bool draining() const { return draining_.load(); }
  bool Idle() const;
  // Client connections open now.
  size_t connections() const { return server_ ? server_->connections() : 0; }

  uint16_t port() const { return server_ ? server_->port() : 0; }
  const RouteSubscriber& routes() const { return routes_; }
  const Admission& admission() const { return admission_; }
  // Null without etcd.
  const FleetAdmission* fleet() const { return fleet_.get(); }
  const EngineOutcomes& outcomes() const { return outcomes_; }
  ShadowStats shadows() const { return shadow_.stats(); }
  // Reads engine_key_file again (SIGHUP): later attempts carry its first key. An error keeps
  // the key sent so far; both are logged. Any thread.
  Status ReloadEngineKey();

 private:
  void Forward(const std::string& route, std::shared_ptr<HttpExchange> exchange);
  void Health(std::shared_ptr<HttpExchange> exchange);
  void Metrics(std::shared_ptr<HttpExchange> exchange);
  nlohmann::json FleetHealth() const;  // the `fleet` object of /health
  RouterGauges FleetGauges() const;
  // baton_router_draining and baton_build_info.
  std::string ProcessMetrics() const;
  bool Authorized(const HttpExchange& exchange) const;
  void StartRoutes();
  // The engines stalled now (options_.stall_timeout) at this evaluation and the one before,
  // by node ("" for the router's own controller: StallTracker), while the io threads run (a
  // router that was frozen reads its engines' bytes late: none is reported until they have
  // run again), each logged and counted once per stall. The report thread's: the
  // subscription's, or with etcd the FleetView's.
  std::map<std::string, std::vector<proto::EngineStalled>> Stalls();
  // Forgets the outcomes of engines unlisted for options_.engine_retention (one log line with
  // the count), at most once per kPruneInterval; io thread (the tick).
  void PruneOutcomes(TimePoint now);
  Status StartFleet();
  // The admission requests go through: the fleet's, or the controller's.
  Admitter* admitter() { return fleet_ ? static_cast<Admitter*>(fleet_.get()) : &admission_; }
  void Run();  // io_.run() on one thread, surviving a handler that throws
  void ScheduleTick();

  RouterOptions options_;
  const Clock& clock_;
  boost::asio::io_context io_;
  std::unique_ptr<ServiceWatchdog> watchdog_;  // its timer on io_
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::steady_timer tick_;
  std::unique_ptr<HttpServer> server_;
  Admission admission_;
  std::unique_ptr<FleetAdmission> fleet_;  // with etcd
  // The etcd endpoints spoken to in plain HTTP off the host (fleet/plaintext_etcd.h).
  const std::vector<std::string> plaintext_etcd_;
  UpstreamPool pool_;
  const std::vector<std::string> api_keys_;  // options_.api_key, or none
  EngineKeySource engine_key_;               // options_.engine_key_file
  EngineOutcomes outcomes_;                  // before routes_: its thread reads them
  EngineProgress progress_;                  // the same
  StallTracker stalls_;                      // the report thread's (Stalls())
  std::atomic<int64_t> last_tick_ns_{0};     // the io threads' last tick, clock_ nanoseconds
  TimePoint last_prune_;                     // the tick's
  ShadowComparer shadow_;
  RouteSubscriber routes_;
  RouterMetrics metrics_;
  std::unique_ptr<FleetView> view_;  // with etcd; stopped before fleet_ goes
  std::vector<std::thread> threads_;
  std::atomic<bool> draining_{false};
};

}  // namespace baton
