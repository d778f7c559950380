#include "controller/ctl/ctl_service.h"

#include <sstream>

#include "base/bug.h"
#include "controller/core/drill_kind.h"
#include "controller/ctl/ctl_fleet.h"
#include "controller/ctl/degradations.h"
#include "controller/upgrade/ctl_upgrade.h"

namespace baton {
namespace {

using nlohmann::json;

constexpr size_t kMaxExtentsShown = 64;  // per engine in `status`; extent_count has them all

double AgoMs(const ControllerStatus& c, TimePoint t) { return MillisBetween(t, c.core.now); }

json EngineJson(const ControllerStatus& c, const EngineStatus& e) {
  json j = {{"id", e.id},
            {"role", proto::ToString(e.role)},
            {"state", ToString(e.state)},
            {"launched_as", proto::ToString(e.launch_role)},
            {"pid", e.pid},
            {"adopted", e.adopted},
            {"epoch", e.ledger.epoch},
            {"blocks", e.ledger.blocks},
            {"version", e.version},
            {"http_address", e.http_address},
            {"port", e.port},
            {"serving", e.serving},
            {"heartbeats", e.heartbeats},
            {"health_probes", e.probes},
            {"uptime_s", AgoMs(c, e.launched_at) / 1000.0},
            {"prefault_ms", static_cast<double>(e.prefault_us) / 1000.0}};
  // [first, count] of each lease, granted or quarantined: the first kMaxExtentsShown of them.
  json extents = json::array();
  for (size_t i = 0; i < e.leases.size() && i < kMaxExtentsShown; ++i) {
    extents.push_back({e.leases[i].extent.first, e.leases[i].extent.count});
  }
  j["extents"] = std::move(extents);
  j["extent_count"] = e.leases.size();
  if (c.core.cuda_backend) j["device_memory"] = e.device_memory;
  if (e.registered) j["last_heartbeat_ms_ago"] = AgoMs(c, e.last_heartbeat);
  if (e.detector.has_value()) j["detector"] = ToString(*e.detector);
  if (e.fence_reason.has_value()) j["fence_reason"] = *e.fence_reason;
  auto cg = c.engine_cgroups.find(e.id);
  auto cpu = c.engine_cpu_s.find(e.id);
  j["cgroup"] = cg != c.engine_cgroups.end() ? json(cg->second) : json();
  j["cpu_s"] = cpu != c.engine_cpu_s.end() ? json(cpu->second) : json();
  j["liveness"] = c.liveness_watched.count(e.id) != 0 ? "watched" : "none";
  return j;
}

// How a fence finds an engine's processes: a cgroup per engine, or its process group only.
json FencingJson(const ControllerStatus& c) {
  const bool by_cgroup = !c.cgroup_base.empty();
  return {{"by", by_cgroup ? "cgroup" : "process_group"},
          {"cgroup_base", by_cgroup ? json(c.cgroup_base) : json()},
          {"cgroup_off_reason", c.cgroups_off_reason},
          {"leftovers_killed", c.leftovers_killed},
          {"cgroups_awaiting_removal", c.cgroups_awaiting_removal},
          {"barrier_waits", c.core.barrier_waits}};
}

json PoolJson(const ControllerStatus& c) {
  const LedgerSnapshot& s = c.core.ledger;
  return {{"blocks", s.block_count},
          {"block_bytes", c.config->block_bytes},
          {"bytes", c.pool.bytes},
          {"free", s.free_blocks},
          {"granted", s.granted_blocks},
          {"quarantined", s.quarantined_blocks},
          {"promotion_reserve",
           {{"target", c.core.reserve_target},
            {"available", c.core.reserve_available},
            {"before_barrier", c.core.reserve_target > 0},
            {"note", c.core.reserve_note}}},
          {"leases", s.leases},
          {"huge_pages", c.pool.huge_pages},
          {"huge_pages_fallback", c.pool.huge_pages_fallback},
          {"adopted", c.pool.adopted}};
}

json WeightsJson(const ControllerStatus& c) {
  const WeightsStatus& w = c.weights;
  return {{"model_dir", w.model_dir},
          {"tensors", w.tensors},
          {"tensor_bytes", w.tensor_bytes},
          {"arena_bytes", w.arena_bytes},
          {"resident_bytes", w.resident_bytes},
          {"huge_pages", w.huge_pages},
          {"huge_bytes", w.huge_bytes},
          {"small_bytes", w.small_bytes},
          {"numa_node", w.numa_node},
          {"numa_bound", w.numa_bound},
          {"numa_source", w.numa_source},
          {"locked", w.locked},
          {"load_method", w.load_method},
          {"load_s", w.load_s},
          {"load_gbps", w.load_gbps},
          {"bytes_read", w.bytes_read},
          {"warnings", w.warnings},
          {"files_differ", w.files_differ.empty() ? json(nullptr) : json(w.files_differ)}};
}

json DeviceJson(const ControllerStatus& c) {
  if (!c.core.cuda_backend) return {{"backend", "host"}};
  const DeviceStatus& d = c.device;
  json j = {{"backend", "cuda"},
            {"lost", !d.present},
            {"losses", c.core.device_losses},
            {"rebuilds", c.core.device_rebuilds},
            {"last_loss", c.core.device_lost_reason},
            {"nvml_lists_engines",
             d.nvml_lists_engines.has_value() ? json(*d.nvml_lists_engines) : json()},
            {"adopted", d.adopted},
            {"adopted_reason", d.adopted ? "" : d.made_anew}};
  if (!d.present) return j;
  const DeviceOwnerStats& s = d.stats;
  j.update(json{{"device", d.device},
                {"weights_bytes", s.weights_bytes},
                {"weights_chunks", s.weights_chunks},
                {"pin", ToString(s.pin)},
                {"pinned", s.pinned},
                {"pin_ms", s.pin_ms},
                {"remat_ms", s.remat_ms},
                {"remat_gbps", s.remat_gbps},
                {"copied_bytes", s.copied_bytes},
                {"pool_bytes", s.pool_bytes},
                {"pool_chunk_bytes", s.pool_chunk_bytes},
                {"pool_chunks", s.pool_chunks}});
  return j;
}

json GuardJson(const ControllerStatus& c) {
  const CoordinatorStatus& g = c.core;
  json j = {{"in_backoff", g.guard_in_backoff},
            {"level", g.guard_level},
            {"recent_failures", g.guard_recent_failures},
            {"total_failures", g.guard_total_failures},
            {"max_failures", c.config->crash.max_failures},
            {"window_s", std::chrono::duration<double>(c.config->crash.window).count()}};
  if (g.guard_in_backoff) j["next_restart_in_ms"] = MillisBetween(g.now, g.guard_next_restart_at);
  return j;
}

template <typename Record>
json TransitionJson(const ControllerStatus& c, const std::string& machine, const Record& r) {
  return {{"machine", machine},   {"from", ToString(r.from)}, {"event", ToString(r.event)},
          {"to", ToString(r.to)}, {"ms_ago", AgoMs(c, r.at)}, {"at", WallTime(r.at, c.core.now)}};
}

json TransitionsJson(const ControllerStatus& c) {
  std::vector<std::pair<TimePoint, json>> all;
  for (const auto& r : c.core.pair_history) all.emplace_back(r.at, TransitionJson(c, "pair", r));
  for (const auto& [id, r] : c.core.departed_history) {
    all.emplace_back(r.at, TransitionJson(c, "engine " + std::to_string(id), r));
  }
  for (const EngineStatus& e : c.core.engines) {
    for (const auto& r : e.history) {
      all.emplace_back(r.at, TransitionJson(c, "engine " + std::to_string(e.id), r));
    }
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  json out = json::array();
  const size_t skip = all.size() > 30 ? all.size() - 30 : 0;
  for (size_t i = skip; i < all.size(); ++i) out.push_back(all[i].second);
  return out;
}

json HistoryJson(const ControllerStatus& c) {
  json refusals = json::array();
  for (const Refusal& r : c.core.refusals) {
    refusals.push_back({{"who", r.who}, {"reason", r.reason}, {"ms_ago", AgoMs(c, r.at)}});
  }
  json exits = json::array();
  for (const EngineExit& x : c.core.exits) {
    exits.push_back({{"id", x.id},
                     {"pid", x.pid},
                     {"launched_as", proto::ToString(x.launch_role)},
                     {"cause", x.cause},
                     {"exit", x.exit},
                     {"ms_ago", AgoMs(c, x.at)}});
  }
  return {{"refusals", refusals}, {"exits", exits}};
}

json RoutesJson(const ControllerStatus& c) {
  const proto::RouteTable& t = c.routes;
  json entries = json::array();
  for (const proto::RouteEntry& e : t.entries) {
    entries.push_back({{"engine_id", e.engine_id},
                       {"role", proto::ToString(e.role)},
                       {"http_address", e.http_address},
                       {"ready", e.ready},
                       {"weight", e.weight}});
  }
  return {{"version", t.version},
          {"epoch", t.epoch},
          {"subscribers", c.route_subscribers},
          {"entries", entries}};
}

// What a restarted controller found and re-adopted.
json RecoveryJson(const ControllerStatus& c) {
  const RecoveryStatus& r = c.core.recovery;
  json fenced = json::array();
  for (const RecoveryStatus::Fenced& f : r.fenced) {
    fenced.push_back({{"id", f.id}, {"reason", f.reason}});
  }
  json gone = json::array();
  for (const RecoveryStatus::Fenced& g : r.gone)
    gone.push_back({{"id", g.id}, {"reason", g.reason}});
  return {{"restarted", r.restarted},
          {"in_progress", r.in_progress},
          {"roster", r.roster},
          {"memory", r.memory},
          {"readopted", r.readopted},
          {"fenced", fenced},
          {"gone", gone},
          {"holders_killed", r.holders_killed},
          {"readopt_ms", r.readopt_ms.has_value() ? json(*r.readopt_ms) : json()},
          {"upgrade", r.upgrade.has_value() ? json(*r.upgrade) : json()}};
}

// Strings in replies come from peers (roles, versions, error texts) and may hold invalid
// UTF-8; they are replaced with U+FFFD rather than refused.
proto::CtlReply Reply(uint32_t code, std::string text, json j) {
  return proto::CtlReply{.exit_code = code,
                         .text = std::move(text),
                         .json = j.dump(-1, ' ', false, json::error_handler_t::replace)};
}

proto::CtlReply Refuse(const std::string& command, const Status& status) {
  const uint32_t code = status.code() == StatusCode::kInvalidArgument ? 2 : 1;
  return Reply(code, "refused: " + status.message(),
               {{"ok", false}, {"command", command}, {"error", status.message()}});
}

proto::CtlReply Usage(const std::string& why) {
  return Reply(2, why + "\n" + CtlUsageHint(), {{"ok", false}, {"error", why}});
}

proto::CtlReply Timeline(const ControllerStatus& c) {
  const std::deque<PromotionRecord>& records = c.core.timelines;
  if (records.empty()) {
    return Reply(0,
                 "no promotion yet by this controller (timelines are kept per controller "
                 "process: a restarted one starts with none; the previous one's log has them)",
                 {{"ok", true}, {"timeline", nullptr}, {"history", json::array()}});
  }
  json history = json::array();
  for (const PromotionRecord& x : records) history.push_back(TimelineJson(x, c.core.now));
  return Reply(
      0, TimelineText(records.back(), c.core.now),
      {{"ok", true}, {"timeline", TimelineJson(records.back(), c.core.now)}, {"history", history}});
}

// `extra`: fields of the reply's JSON beside ok, command and pair.
proto::CtlReply Done(const std::string& command, const std::string& text, Controller& c,
                     json extra = json::object()) {
  extra.update(
      json{{"ok", true}, {"command", command}, {"pair", ToString(c.coordinator().pair_state())}});
  return Reply(0, text, std::move(extra));
}

// An upgrade or rollback with no engine serving: the command was switched, with no canary.
proto::CtlReply SwitchedAtOnce(const std::string& command, Coordinator& co, Controller& c) {
  const std::vector<std::string> active = co.Snapshot().active_command;
  return Done(
      command,
      "no engine serves: no canary to judge, so engines launch from now on with: " + Joined(active),
      c, {{"engine_command", active}, {"canary", false}});
}

}  // namespace

json StatusJson(const ControllerStatus& c) {
  const CoordinatorStatus& core = c.core;
  json engines = json::array();
  for (const EngineStatus& e : core.engines) engines.push_back(EngineJson(c, e));
  return {{"ok", true},
          {"controller",
           {{"pid", c.pid},
            {"name", c.config->name},
            {"socket", c.config->socket_path()},
            {"router_socket",
             c.config->router_socket.empty() ? json(nullptr) : json(c.config->router_socket)},
            {"engine_key_file",
             c.config->engine_key_file.empty() ? json(nullptr) : json(c.config->engine_key_file)},
            {"uptime_s", AgoMs(c, c.started_at) / 1000.0},
            {"started_at", WallTime(c.started_at, core.now)},
            {"incarnation", core.incarnation},
            {"restarts", c.restarts},
            {"keeper",
             {{"state", ToString(c.keeper.state)},
              {"pid", c.keeper.pid},
              {"restarts", c.keeper.restarts},
              {"detail", c.keeper.detail}}},
            {"launches", core.launches},
            {"failovers", core.failovers},
            {"switchovers_called_off", core.called_off_switchovers},
            {"refusals", core.refusal_count},
            {"refused_transitions", core.refused_transitions},
            {"bugs", BugCount()},
            {"recovery", RecoveryJson(c)}}},
          {"pair", {{"state", ToString(core.pair_state)}, {"primary", core.primary}}},
          {"epoch",
           {{"durable", c.journal.durable},
            {"issued", core.ledger.issued_epoch},
            {"reserved", c.journal.reserved},
            {"reserve_batch", c.journal.reserve_batch},
            {"journal_error",
             c.journal.last_write.ok() ? json(nullptr) : json(c.journal.last_write.ToString())},
            {"journal_write_failures", c.journal.write_failures},
            {"unfenced_reaped", core.unfenced_reaped}}},
          {"engines", engines},
          {"pool", PoolJson(c)},
          {"weights", WeightsJson(c)},
          {"degraded", DegradationJson(c)},
          {"device", DeviceJson(c)},
          {"fencing", FencingJson(c)},
          {"crash_loop", GuardJson(c)},
          {"routes", RoutesJson(c)},
          {"fleet", FleetJson(c)},
          {"transitions", TransitionsJson(c)},
          {"last_promotion",
           core.timelines.empty() ? json(nullptr) : TimelineJson(core.timelines.back(), core.now)},
          {"history", HistoryJson(c)},
          {"upgrade", UpgradeJson(c)},
          {"invariants", core.invariants.ok() ? "ok" : core.invariants.message()}};
}

namespace {

proto::CtlReply Dispatch(Controller& c, const proto::CtlRequest& request) {
  const std::string& cmd = request.command;
  const auto& args = request.args;
  Coordinator& co = c.coordinator();
  if (cmd != "fleet") {  // fleet's arguments are checked where it is answered
    if (Status checked = CheckCtlArgs(cmd, args); !checked.ok()) return Usage(checked.message());
  }
  if (cmd == "status") {
    const ControllerStatus s = c.Snapshot();
    return Reply(0, StatusText(s), StatusJson(s));
  }
  if (cmd == "timeline") return Timeline(c.Snapshot());
  if (cmd == "promote") {
    Status status = co.RequestSwitchover();
    if (!status.ok()) return Refuse(cmd, status);
    return Done(cmd, "switch-over started: the primary drains, then the standby is promoted", c);
  }
  if (cmd == "drain") {
    Status status = co.RequestDrain();
    if (!status.ok()) return Refuse(cmd, status);
    return Done(cmd, "draining: the primary finishes its requests, then the pair stops", c);
  }
  if (cmd == "resume") {
    Status status = co.RequestResume();
    if (!status.ok()) return Refuse(cmd, status);
    return Done(cmd, "resuming: the pair serves again (a drain undone)", c);
  }
  if (cmd == "upgrade") {
    Result<UpgradeRequest> req = ParseUpgradeArgs(args);
    if (!req.ok()) return Usage(req.status().message());
    Status status = co.RequestUpgrade(std::move(req).value());
    if (!status.ok()) return Refuse(cmd, status);
    if (!co.Snapshot().upgrade.has_value()) return SwitchedAtOnce(cmd, co, c);
    return Done(cmd, "upgrade started: the standby makes way for a canary of the new command", c);
  }
  if (cmd == "rollback") {
    Result<UpgradeRequest> req = ParseRollbackArgs(args);
    if (!req.ok()) return Usage(req.status().message());
    const std::optional<UpgradeStatus> up = co.Snapshot().upgrade;
    if (Status s = CheckRollbackOptions(*req, up.has_value()); !s.ok()) return Refuse(cmd, s);
    Status status = co.RequestRollback(std::move(req).value());
    if (!status.ok()) return Refuse(cmd, status);
    if (!up.has_value()) {  // an upgrade back to the previous command: say what it launches
      const std::optional<UpgradeStatus> started = co.Snapshot().upgrade;
      if (!started.has_value()) return SwitchedAtOnce(cmd, co, c);
      const std::vector<std::string> command = started->command;
      return Done(cmd, "rollback started: a canary of the previous command: " + Joined(command), c,
                  {{"engine_command", command}});
    }
    const bool serving = up->weight > 0;  // a canary routed requests
    return Done(cmd,
                serving ? "rolling back: the canary drains and the primary takes its share"
                        : "rolling back: the canary, not serving yet, is stopped",
                c);
  }
  if (cmd == "drill") {
    Result<DrillKind> kind = ParseDrillKind(args[0]);
    if (!kind.ok()) return Refuse(cmd, kind.status());
    Status status = co.Drill(*kind);
    if (!status.ok()) return Refuse(cmd, status);
    return Done(cmd, std::string("drill ") + ToString(*kind) + " sent to the primary", c);
  }
  if (cmd == "fleet") {
    // With [fleet], the rollout's thread answers these (controller.cc); here there is none.
    return Refuse(cmd, FailedPrecondition("this controller has no [fleet] etcd configured"));
  }
  if (cmd == "controller") {
    if (co.stopping()) return Refuse(cmd, Unavailable("the controller is shutting down"));
    // After the reply is sent: the next controller re-adopts the engines and the memory.
    c.ScheduleHandOver("batonctl controller restart");
    return Done(cmd,
                "the controller exits now; the service manager starts the next one, which "
                "re-adopts the engines, the weights and the pool",
                c);
  }
  return Usage("unknown command '" + cmd + "'");
}

}  // namespace

proto::CtlReply HandleCtlRequest(Controller& c, const proto::CtlRequest& request) {
  try {
    return Dispatch(c, request);
  } catch (const std::exception& e) {
    return Reply(1, std::string("refused: internal error: ") + e.what(),
                 {{"ok", false}, {"command", request.command}, {"error", e.what()}});
  }
}

}  // namespace baton
