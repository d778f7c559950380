#include "router/router_metrics.h"

#include "base/text/metric_number.h"

namespace baton {
namespace {

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

std::string RouteLabel(const std::string& route) { return "route=\"" + Escape(route) + "\""; }

void Header(const char* name, const char* type, const char* help, std::string* out) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void Gauge(const char* name, const char* help, double value, std::string* out) {
  Header(name, "gauge", help, out);
  *out += std::string(name) + " " + MetricNumber(value) + "\n";
}

// A counter by engine id: `field` of each outcome.
void EngineCounter(const char* name, const char* help,
                   const std::vector<proto::EngineOutcome>& outcomes,
                   uint64_t proto::EngineOutcome::*field, std::string* out) {
  Header(name, "counter", help, out);
  for (const proto::EngineOutcome& o : outcomes) {
    *out += std::string(name) + "{engine_id=\"" + std::to_string(o.engine_id) + "\"} " +
            std::to_string(o.*field) + "\n";
  }
}

}  // namespace

void Histogram::Observe(double seconds) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (seconds <= bounds_[i]) ++buckets_[i];
  }
  ++count_;
  sum_ += seconds;
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < bounds_.size(); ++i) {
    *out += name + "_bucket{" + labels + sep + "le=\"" + MetricNumber(bounds_[i]) + "\"} " +
            std::to_string(buckets_[i]) + "\n";
  }
  *out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(count_) + "\n";
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  *out += name + "_sum" + braces + " " + MetricNumber(sum_) + "\n";
  *out += name + "_count" + braces + " " + std::to_string(count_) + "\n";
}

RouterMetrics::RouterMetrics() {
  MutexLock lock(mu_);
  for (const char* route : {"/v1/completions", "/v1/chat/completions"}) {
    for (int status : {200, 429, 503}) requests_[{route, status}] = 0;
  }
  upstream_errors_["engine_key"] = 0;  // BatonRouterEngineKeyRefused fires on its first
}

void RouterMetrics::Record(const std::string& route, int status) {
  MutexLock lock(mu_);
  ++requests_[{route, status}];
}

void RouterMetrics::RecordUpstreamError(const std::string& kind) {
  MutexLock lock(mu_);
  ++upstream_errors_[kind];
}

void RouterMetrics::ObserveFirstToken(const std::string& route, double seconds) {
  MutexLock lock(mu_);
  first_token_[route].Observe(seconds);
}

void RouterMetrics::ObserveDuration(const std::string& route, double seconds) {
  MutexLock lock(mu_);
  duration_[route].Observe(seconds);
}

void RouterMetrics::ObserveQueueWait(double seconds) {
  MutexLock lock(mu_);
  queue_wait_.Observe(seconds);
}

void RouterMetrics::RecordReplay(bool tokens_sent) {
  MutexLock lock(mu_);
  ++(tokens_sent ? replays_ : retries_);
}

void RouterMetrics::RecordReplayFailure() {
  MutexLock lock(mu_);
  ++replay_failures_;
}

void RouterMetrics::RecordEngineStall() {
  MutexLock lock(mu_);
  ++engine_stalls_;
}

void RouterMetrics::ObserveFailoverNextToken(double seconds) {
  MutexLock lock(mu_);
  failover_next_token_.Observe(seconds);
}

std::string RouterMetrics::Render(const RouterGauges& g) const {
  std::string out;
  {
    MutexLock lock(mu_);
    Header("baton_router_requests_total", "counter", "Requests answered, by route and status.",
           &out);
    for (const auto& [key, n] : requests_) {
      out += "baton_router_requests_total{" + RouteLabel(key.first) + ",status=\"" +
             std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
    }
    Header("baton_router_upstream_errors_total", "counter", "Failed engine attempts, by kind.",
           &out);
    for (const auto& [kind, n] : upstream_errors_) {
      out += "baton_router_upstream_errors_total{kind=\"" + Escape(kind) + "\"} " +
             std::to_string(n) + "\n";
    }
    Header("baton_router_time_to_first_token_seconds", "histogram",
           "Arrival to the first token event sent to the client, streams only.", &out);
    for (const auto& [route, h] : first_token_) {
      h.Render("baton_router_time_to_first_token_seconds", RouteLabel(route), &out);
    }
    Header("baton_router_request_duration_seconds", "histogram",
           "Arrival to the end of the response.", &out);
    for (const auto& [route, h] : duration_) {
      h.Render("baton_router_request_duration_seconds", RouteLabel(route), &out);
    }
    Header("baton_router_queue_wait_seconds", "histogram",
           "Time a request waited for an engine (queue and replays).", &out);
    queue_wait_.Render("baton_router_queue_wait_seconds", "", &out);
    Header("baton_router_replays_total", "counter",
           "Attempts after an engine failed: replay (continued on token ids) or retry (whole).",
           &out);
    out += "baton_router_replays_total{kind=\"replay\"} " + std::to_string(replays_) + "\n";
    out += "baton_router_replays_total{kind=\"retry\"} " + std::to_string(retries_) + "\n";
    Header("baton_router_replay_failures_total", "counter",
           "Streams ended with an explicit error because they could not be continued.", &out);
    out += "baton_router_replay_failures_total " + std::to_string(replay_failures_) + "\n";
    Header("baton_router_engine_stalls_total", "counter",
           "Engines whose streams all stood still for stall_timeout_ms, reported to the "
           "controller.",
           &out);
    out += "baton_router_engine_stalls_total " + std::to_string(engine_stalls_) + "\n";
    Header("baton_router_failover_next_token_seconds", "histogram",
           "An attempt that had sent tokens failed, to the first new token of its continuation.",
           &out);
    failover_next_token_.Render("baton_router_failover_next_token_seconds", "", &out);
  }
  Gauge("baton_router_queue_length", "Requests waiting for an engine.",
        static_cast<double>(g.queued), &out);
  Gauge("baton_router_in_flight", "Requests on an engine now.", static_cast<double>(g.in_flight),
        &out);
  Header("baton_router_failovers_total", "counter", "Primary changes seen in the route table.",
         &out);
  out += "baton_router_failovers_total " + std::to_string(g.failovers) + "\n";
  Header("baton_router_engine_weight_percent", "gauge",
         "Share of new requests each engine takes now, the ramp applied.", &out);
  for (const TargetWeight& w : g.weights) {
    out += "baton_router_engine_weight_percent{engine_id=\"" + std::to_string(w.target.engine_id) +
           "\",address=\"" + Escape(w.target.address) + "\",role=\"" +
           Escape(proto::ToString(w.role)) + "\"} " + MetricNumber(w.weight) + "\n";
  }
  Header("baton_router_engine_requests_total", "counter",
         "Engine attempts that ended, by engine (failed, succeeded or abandoned).", &out);
  for (const proto::EngineOutcome& o : g.outcomes) {
    out += "baton_router_engine_requests_total{engine_id=\"" + std::to_string(o.engine_id) +
           "\"} " + std::to_string(o.requests) + "\n";
  }
  Header("baton_router_engine_errors_total", "counter",
         "Engine attempts that failed (connection lost, stream broken, answer 5xx), by engine.",
         &out);
  for (const proto::EngineOutcome& o : g.outcomes) {
    out += "baton_router_engine_errors_total{engine_id=\"" + std::to_string(o.engine_id) + "\"} " +
           std::to_string(o.errors) + "\n";
  }
  EngineCounter("baton_router_engine_compared_total",
                "A canary's reproducible answers compared with the primary's, by canary engine.",
                g.outcomes, &proto::EngineOutcome::compared, &out);
  EngineCounter("baton_router_engine_disagreed_total",
                "Compared answers whose token ids differed from the primary's, by canary engine.",
                g.outcomes, &proto::EngineOutcome::disagreed, &out);
  Header("baton_router_shadows_total", "counter",
         "Shadow requests to the primary: compared, failed, or skipped as busy.", &out);
  out += "baton_router_shadows_total{outcome=\"compared\"} " + std::to_string(g.shadows.compared) +
         "\n";
  out +=
      "baton_router_shadows_total{outcome=\"failed\"} " + std::to_string(g.shadows.failed) + "\n";
  out += "baton_router_shadows_total{outcome=\"busy\"} " + std::to_string(g.shadows.busy) + "\n";
  std::string primary;
  uint64_t primary_id = 0;
  for (const proto::RouteEntry& e : g.table.entries) {
    if (e.role == proto::EngineRole::kPrimary && e.ready) {
      primary = e.http_address;
      primary_id = e.engine_id;
    }
  }
  Header("baton_router_primary", "gauge", "The ready primary (1), by engine and address.", &out);
  if (!primary.empty()) {
    out += "baton_router_primary{engine_id=\"" + std::to_string(primary_id) + "\",address=\"" +
           Escape(primary) + "\"} 1\n";
  }
  Gauge("baton_router_has_primary", "1 when the route table has a ready primary.",
        primary.empty() ? 0 : 1, &out);
  if (g.fleet) {  // no controller of its own: each node's table is in the fleet's gauges
    RenderFleet(g, &out);
    return out;
  }
  Gauge("baton_router_route_table_version", "Version of the last route table received.",
        static_cast<double>(g.table.version), &out);
  Gauge("baton_router_epoch", "Epoch of the last route table received.",
        static_cast<double>(g.table.epoch), &out);
  Gauge("baton_router_controller_connected", "1 while subscribed to the controller.",
        g.controller_connected ? 1 : 0, &out);
  return out;
}

void RouterMetrics::RenderFleet(const RouterGauges& g, std::string* out) {
  size_t listed = 0;
  for (const FleetNodeView& n : g.fleet_nodes) listed += n.listed ? 1 : 0;
  Gauge("baton_router_fleet_nodes", "Fleet nodes listed in etcd now.", static_cast<double>(listed),
        out);
  Gauge("baton_router_fleet_etcd_connected", "1 while the last read of etcd answered.",
        g.fleet_view.etcd_connected ? 1 : 0, out);
  Header("baton_router_fleet_etcd_failures_total", "counter", "Calls to etcd that failed.", out);
  *out += "baton_router_fleet_etcd_failures_total " + std::to_string(g.fleet_view.failures) + "\n";
  Header("baton_router_fleet_reports_refused_total", "counter",
         "Writes or deletions of this router's reports that etcd refused.", out);
  *out += "baton_router_fleet_reports_refused_total " +
          std::to_string(g.fleet_view.reports_refused) + "\n";
  Header("baton_router_fleet_node_up", "gauge",
         "By node seen: 1 while listed with a ready primary and not passed over.", out);
  for (const FleetNodeView& n : g.fleet_nodes) {
    const bool up = n.listed && n.primary && !n.suspect;
    *out += "baton_router_fleet_node_up{node=\"" + Escape(n.name) + "\",model=\"" +
            Escape(n.model) + "\"} " + (up ? "1" : "0") + "\n";
  }
  Header("baton_router_fleet_node_in_flight", "gauge", "Requests on a node's engines now.", out);
  for (const FleetNodeView& n : g.fleet_nodes) {
    *out += "baton_router_fleet_node_in_flight{node=\"" + Escape(n.name) + "\"} " +
            std::to_string(n.in_flight) + "\n";
  }
  Header("baton_router_fleet_engine_requests_total", "counter",
         "Engine attempts that ended, by node and engine.", out);
  for (const auto& [node, o] : g.fleet_outcomes) {
    *out += "baton_router_fleet_engine_requests_total{node=\"" + Escape(node) + "\",engine_id=\"" +
            std::to_string(o.engine_id) + "\"} " + std::to_string(o.requests) + "\n";
  }
  Header("baton_router_fleet_engine_errors_total", "counter",
         "Engine attempts that failed, by node and engine.", out);
  for (const auto& [node, o] : g.fleet_outcomes) {
    *out += "baton_router_fleet_engine_errors_total{node=\"" + Escape(node) + "\",engine_id=\"" +
            std::to_string(o.engine_id) + "\"} " + std::to_string(o.errors) + "\n";
  }
}

}  // namespace baton
