#include "controller/ctl/ctl_service.h"

#include <sys/mman.h>
#include <unistd.h>

#include <sstream>

#include "controller/upgrade/ctl_upgrade.h"

namespace baton {
namespace {

using nlohmann::json;

constexpr size_t kMaxExtentsShown = 64;  // per engine in `status`; extent_count has them all

double AgoMs(const Controller& c, TimePoint t) { return MillisBetween(t, c.clock().Now()); }

json EngineJson(const Controller& c, const EngineRecord& e) {
  const LedgerEngine* le = c.ledger().engine(e.id);
  json j = {{"id", e.id},
            {"role", EngineRole(c, e)},
            {"state", ToString(e.machine.state())},
            {"launched_as", e.launch_role},
            {"pid", e.process.pid()},
            {"epoch", le != nullptr ? le->epoch : 0},
            {"blocks", le != nullptr ? le->blocks : 0},
            {"version", e.version},
            {"http_address", e.http_address},
            {"port", e.port},
            {"serving", e.serving},
            {"heartbeats", e.heartbeats},
            {"health_probes", e.probes},
            {"uptime_s", AgoMs(c, e.launched_at) / 1000.0},
            {"prefault_ms", static_cast<double>(e.prefault_us) / 1000.0}};
  // [first, count] of each lease, granted or quarantined: the first kMaxExtentsShown of them.
  const std::vector<Lease> leases = c.ledger().LeasesOf(e.id);
  json extents = json::array();
  for (size_t i = 0; i < leases.size() && i < kMaxExtentsShown; ++i) {
    extents.push_back({leases[i].extent.first, leases[i].extent.count});
  }
  j["extents"] = std::move(extents);
  j["extent_count"] = leases.size();
  if (c.cuda_backend()) j["device_memory"] = e.device_memory;
  if (e.registered) j["last_heartbeat_ms_ago"] = AgoMs(c, e.last_heartbeat);
  if (e.detector.has_value()) j["detector"] = ToString(e.detector->state());
  if (e.failed.has_value()) j["fence_reason"] = e.fail_reason;
  j["cgroup"] = e.cgroup != nullptr ? json(e.cgroup->path()) : json();
  j["cpu_s"] = e.cgroup != nullptr ? json(e.cgroup->CpuSeconds()) : json();
  return j;
}

// How a fence finds an engine's processes: a cgroup per engine, or its process group only.
json FencingJson(const Controller& c) {
  const EngineCgroups* g = c.cgroups();
  return {{"by", g != nullptr ? "cgroup" : "process_group"},
          {"cgroup_base", g != nullptr ? json(g->base()) : json()},
          {"cgroup_off_reason", c.cgroups_off_reason()},
          {"leftovers_killed", g != nullptr ? g->leftovers_killed() : 0},
          {"barrier_waits", c.barrier_waits()}};
}

json PoolJson(const Controller& c) {
  const LedgerSnapshot s = c.ledger().Snapshot();
  return {{"blocks", s.block_count},
          {"block_bytes", c.config().block_bytes},
          {"bytes", c.pool().size()},
          {"free", s.free_blocks},
          {"granted", s.granted_blocks},
          {"quarantined", s.quarantined_blocks},
          {"leases", s.leases},
          {"huge_pages", c.pool().huge_pages()},
          {"huge_pages_fallback", c.pool().fallback_reason()}};
}

// Bytes of [data, data + size) resident in memory now (mincore), or -1 if unknown.
int64_t ResidentBytes(const uint8_t* data, uint64_t size) {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (data == nullptr || size == 0) return 0;
  std::vector<unsigned char> pages((size + page - 1) / page);
  if (::mincore(const_cast<uint8_t*>(data), size, pages.data()) != 0) return -1;
  uint64_t resident = 0;
  for (unsigned char p : pages) resident += (p & 1) != 0 ? page : 0;
  return static_cast<int64_t>(std::min(resident, size));
}

json WeightsJson(const Controller& c) {
  const WeightCache& w = c.weights();
  const PinnedArena& a = w.arena();
  return {{"model_dir", w.dir()},
          {"tensors", w.tensors().size()},
          {"tensor_bytes", w.tensor_bytes()},
          {"arena_bytes", a.size()},
          {"resident_bytes", ResidentBytes(a.data(), a.size())},
          {"huge_pages", a.huge_pages()},
          {"numa_node", a.numa_node()},
          {"numa_bound", a.numa_bound()},
          {"numa_source", a.numa_source()},
          {"locked", a.locked()},
          {"load_method", w.load_stats().method},
          {"load_s", w.load_stats().seconds},
          {"load_gbps", w.load_stats().gbps},
          {"warnings", a.warnings()}};
}

json DeviceJson(const Controller& c) {
  if (!c.cuda_backend()) return {{"backend", "host"}};
  json j = {{"backend", "cuda"},
            {"lost", c.device() == nullptr},
            {"losses", c.device_losses()},
            {"rebuilds", c.device_rebuilds()},
            {"last_loss", c.device_lost_reason()},
            {"nvml_lists_engines",
             c.nvml_lists_engines().has_value() ? json(*c.nvml_lists_engines()) : json()}};
  const DeviceOwner* d = c.device();
  if (d == nullptr) return j;
  const DeviceOwnerStats& s = d->stats();
  j.update(json{{"device", d->device()},
                {"weights_bytes", s.weights_bytes},
                {"weights_chunks", s.weights_chunks},
                {"pinned", s.pinned},
                {"pin_ms", s.pin_ms},
                {"remat_ms", s.remat_ms},
                {"remat_gbps", s.remat_gbps},
                {"pool_bytes", s.pool_bytes},
                {"pool_chunk_bytes", s.pool_chunk_bytes},
                {"pool_chunks", s.pool_chunks}});
  return j;
}

json GuardJson(const Controller& c) {
  const CrashLoopGuard& g = c.guard();
  json j = {{"in_backoff", g.InBackoff()},
            {"level", g.level()},
            {"recent_failures", g.recent_failures()},
            {"total_failures", g.total_failures()},
            {"max_failures", c.config().crash_max_failures},
            {"window_s", std::chrono::duration<double>(c.config().crash_window).count()}};
  if (g.InBackoff()) j["next_restart_in_ms"] = MillisBetween(c.clock().Now(), g.NextRestartAt());
  return j;
}

template <typename Record>
json TransitionJson(const Controller& c, const std::string& machine, const Record& r) {
  return {{"machine", machine},         {"from", ToString(r.from)},
          {"event", ToString(r.event)}, {"to", ToString(r.to)},
          {"ms_ago", AgoMs(c, r.at)},   {"at", WallTime(r.at, c.clock().Now())}};
}

json TransitionsJson(const Controller& c) {
  std::vector<std::pair<TimePoint, json>> all;
  for (const auto& r : c.pair().history()) all.emplace_back(r.at, TransitionJson(c, "pair", r));
  for (const auto& [id, e] : c.engines()) {
    for (const auto& r : e->machine.history()) {
      all.emplace_back(r.at, TransitionJson(c, e->machine.name(), r));
    }
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  json out = json::array();
  const size_t skip = all.size() > 30 ? all.size() - 30 : 0;
  for (size_t i = skip; i < all.size(); ++i) out.push_back(all[i].second);
  return out;
}

json HistoryJson(const Controller& c) {
  json refusals = json::array();
  for (const Refusal& r : c.refusals()) {
    refusals.push_back({{"who", r.who}, {"reason", r.reason}, {"ms_ago", AgoMs(c, r.at)}});
  }
  json exits = json::array();
  for (const EngineExit& x : c.exits()) {
    exits.push_back({{"id", x.id},
                     {"pid", x.pid},
                     {"launched_as", x.launch_role},
                     {"cause", x.cause},
                     {"exit", x.exit},
                     {"ms_ago", AgoMs(c, x.at)}});
  }
  return {{"refusals", refusals}, {"exits", exits}};
}

json RoutesJson(const Controller& c) {
  const proto::RouteTable& t = c.routes().current();
  json entries = json::array();
  for (const proto::RouteEntry& e : t.entries) {
    entries.push_back({{"engine_id", e.engine_id},
                       {"role", e.role},
                       {"http_address", e.http_address},
                       {"ready", e.ready},
                       {"weight", e.weight}});
  }
  return {{"version", t.version},
          {"epoch", t.epoch},
          {"subscribers", c.routes().subscriber_count()},
          {"entries", entries}};
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
  return Reply(2, why + "\n" + CtlUsage(), {{"ok", false}, {"error", why}});
}

proto::CtlReply Timeline(const Controller& c) {
  const PromotionRecord* r = c.timelines().last();
  if (r == nullptr) {
    return Reply(0, "no promotion yet",
                 {{"ok", true}, {"timeline", nullptr}, {"history", json::array()}});
  }
  json history = json::array();
  for (const PromotionRecord& x : c.timelines().records())
    history.push_back(c.timelines().ToJson(x));
  return Reply(0, c.timelines().ToText(*r),
               {{"ok", true}, {"timeline", c.timelines().ToJson(*r)}, {"history", history}});
}

proto::CtlReply Done(const std::string& command, const std::string& text, const Controller& c) {
  return Reply(0, text, {{"ok", true}, {"command", command}, {"pair", ToString(c.pair().state())}});
}

}  // namespace

std::string EngineRole(const Controller& c, const EngineRecord& e) {
  if (e.failed.has_value()) return "fencing";
  if (e.id == c.primary()) return e.is(EngineState::kDraining) ? "draining" : "primary";
  if (c.upgrade().has_value() && c.upgrade()->canary == e.id && !e.is(EngineState::kLaunching) &&
      !e.is(EngineState::kStandby)) {
    return e.is(EngineState::kPromoting)  ? "promoting"
           : e.is(EngineState::kDraining) ? "draining"
                                          : "canary";
  }
  if (e.is(EngineState::kPromoting)) return "promoting";
  if (e.is(EngineState::kStandby)) return "standby";
  return "launching";
}

json StatusJson(const Controller& c) {
  json engines = json::array();
  for (const auto& [id, e] : c.engines()) engines.push_back(EngineJson(c, *e));
  const PromotionRecord* last = c.timelines().last();
  return {
      {"ok", true},
      {"controller",
       {{"pid", ::getpid()},
        {"name", c.config().name},
        {"socket", c.config().socket_path()},
        {"uptime_s", AgoMs(c, c.started_at()) / 1000.0},
        {"launches", c.launches()},
        {"failovers", c.failovers()},
        {"switchovers_called_off", c.called_off_switchovers()},
        {"refusals", c.refusal_count()}}},
      {"pair", {{"state", ToString(c.pair().state())}, {"primary", c.primary()}}},
      {"epoch",
       {{"durable", c.durable_epoch()},
        {"issued", c.ledger().issued_epoch()},
        {"reserved", c.reserved_epoch()},
        {"reserve_batch", c.journal().reserve_batch()},
        {"journal_error",
         c.journal().last_write().ok() ? json(nullptr) : json(c.journal().last_write().ToString())},
        {"journal_write_failures", c.journal().write_failures()},
        {"unfenced_reaped", c.unfenced_reaped()}}},
      {"engines", engines},
      {"pool", PoolJson(c)},
      {"weights", WeightsJson(c)},
      {"device", DeviceJson(c)},
      {"fencing", FencingJson(c)},
      {"crash_loop", GuardJson(c)},
      {"routes", RoutesJson(c)},
      {"transitions", TransitionsJson(c)},
      {"last_promotion", last != nullptr ? c.timelines().ToJson(*last) : json(nullptr)},
      {"history", HistoryJson(c)},
      {"upgrade", UpgradeJson(c)},
      {"invariants", c.invariants()}};
}

// The route table, then the last refusals and engine exits (five of each), for StatusText.
void RoutesAndHistoryText(const json& s, std::ostringstream& out) {
  const json& r = s["routes"];
  out << "routes v" << r["version"] << " epoch " << r["epoch"] << ", " << r["subscribers"]
      << " subscribers:";
  for (const json& e : r["entries"]) {
    out << " engine " << e["engine_id"] << "=" << e["role"].get<std::string>()
        << (e["ready"].get<bool>() ? "(ready " : "(not ready ") << e["weight"] << "%)";
  }
  out << (r["entries"].empty() ? " none\n" : "\n");
  const json& h = s["history"];
  const size_t refusals = h["refusals"].size(), exits = h["exits"].size();
  for (size_t i = refusals > 5 ? refusals - 5 : 0; i < refusals; ++i) {
    const json& x = h["refusals"][i];
    out << "refused " << x["who"].get<std::string>() << ": " << x["reason"].get<std::string>()
        << " (" << static_cast<int64_t>(x["ms_ago"].get<double>()) << " ms ago)\n";
  }
  for (size_t i = exits > 5 ? exits - 5 : 0; i < exits; ++i) {
    const json& x = h["exits"][i];
    out << "exit: engine " << x["id"] << " pid " << x["pid"] << " ("
        << x["launched_as"].get<std::string>() << "): " << x["cause"].get<std::string>() << ", "
        << x["exit"].get<std::string>() << " (" << static_cast<int64_t>(x["ms_ago"].get<double>())
        << " ms ago)\n";
  }
}

std::string StatusText(const Controller& c) {
  const json s = StatusJson(c);
  std::ostringstream out;
  out << "pair " << s["pair"]["state"].get<std::string>() << ", epoch " << s["epoch"]["durable"]
      << ", invariants " << c.invariants() << "\n";
  for (const json& e : s["engines"]) {
    out << "  engine " << e["id"] << " " << e["role"].get<std::string>() << " pid " << e["pid"]
        << " epoch " << e["epoch"] << " blocks " << e["blocks"] << " version "
        << e["version"].get<std::string>() << " " << e["http_address"].get<std::string>() << "\n";
  }
  const json& p = s["pool"];
  out << "pool " << p["blocks"] << " blocks x " << p["block_bytes"] << " B: " << p["granted"]
      << " granted, " << p["quarantined"] << " quarantined, " << p["free"] << " free"
      << (p["huge_pages"].get<bool>() ? " (huge pages)" : " (normal pages)") << "\n";
  const json& w = s["weights"];
  out << "weights " << w["model_dir"].get<std::string>() << ": " << w["tensors"] << " tensors, "
      << w["resident_bytes"] << " of " << w["arena_bytes"] << " B resident, numa node "
      << w["numa_node"] << (w["huge_pages"].get<bool>() ? ", huge pages" : "")
      << (w["locked"].get<bool>() ? ", locked" : ", not locked") << ", loaded at " << w["load_gbps"]
      << " GB/s\n";
  RoutesAndHistoryText(s, out);
  if (c.device() != nullptr) out << "device memory: " << c.device()->Describe() << "\n";
  if (c.cuda_backend() && c.device() == nullptr) {
    out << "device memory: LOST (" << c.device_lost_reason() << "), rebuilding; engines held\n";
  }
  if (c.device_losses() > 0) {
    out << "device losses: " << c.device_losses() << ", rebuilds: " << c.device_rebuilds()
        << ", last: " << c.device_lost_reason() << "\n";
  }
  if (!c.journal().last_write().ok()) {
    const uint64_t left = c.reserved_epoch() - c.durable_epoch();
    out << "epoch journal: CANNOT WRITE (" << c.journal().last_write().ToString() << "); "
        << (left == 0 ? std::string("new epochs are held")
                      : std::to_string(left) + " reserved epochs left");
    for (EngineId id : c.unfenced_reaped()) out << "; engine " << id << " waits to be fenced";
    out << "\n";
  }
  out << UpgradeText(c);
  out << "fencing: "
      << (c.cgroups() != nullptr ? "a cgroup per engine under " + c.cgroups()->base()
                                 : "process groups only (" + c.cgroups_off_reason() + ")")
      << "\n";
  const json& g = s["crash_loop"];
  out << "crash-loop guard: " << g["recent_failures"] << " recent failures, level " << g["level"]
      << (g["in_backoff"].get<bool>() ? ", in backoff" : "") << "\n";
  out << "recent transitions:\n";
  for (const json& t : s["transitions"]) {
    out << "  " << t["at"].get<std::string>() << " " << t["machine"].get<std::string>() << ": "
        << t["from"].get<std::string>() << " -> " << t["to"].get<std::string>() << " on "
        << t["event"].get<std::string>() << "\n";
  }
  return out.str();
}

namespace {

proto::CtlReply Dispatch(Controller& c, const proto::CtlRequest& request) {
  const std::string& cmd = request.command;
  const auto& args = request.args;
  if (cmd == "status") return Reply(0, StatusText(c), StatusJson(c));
  if (cmd == "timeline") return Timeline(c);
  if (cmd == "promote") {
    Status status = c.RequestSwitchover();
    if (!status.ok()) return Refuse(cmd, status);
    return Done(cmd, "switch-over started: the primary drains, then the standby is promoted", c);
  }
  if (cmd == "drain") {
    Status status = c.RequestDrain();
    if (!status.ok()) return Refuse(cmd, status);
    return Done(cmd, "draining: the primary finishes its requests, then the pair stops", c);
  }
  if (cmd == "upgrade") {
    Result<UpgradeRequest> req = ParseUpgradeArgs(args);
    if (!req.ok()) return Usage(req.status().message());
    Status status = c.RequestUpgrade(std::move(req).value());
    if (!status.ok()) return Refuse(cmd, status);
    return Done(cmd, "upgrade started: the standby makes way for a canary of the new command", c);
  }
  if (cmd == "rollback") {
    Result<UpgradeRequest> req = ParseRollbackArgs(args);
    if (!req.ok()) return Usage(req.status().message());
    const bool canary = c.upgrade().has_value();
    Status status = c.RequestRollback(std::move(req).value());
    if (!status.ok()) return Refuse(cmd, status);
    return Done(cmd,
                canary ? "rolling back: the canary drains and the primary takes its share"
                       : "rollback started: a canary of the previous command",
                c);
  }
  if (cmd == "drill") {
    if (args.size() != 1) return Usage("drill needs one of: kill, hang, error");
    Status status = c.Drill(args[0]);
    if (!status.ok()) return Refuse(cmd, status);
    return Done(cmd, "drill " + args[0] + " sent to the primary", c);
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

const char* CtlUsage() {
  return R"(usage: batonctl [--json] [--socket PATH] [--timeout-ms N] COMMAND [ARGS]

commands:
  status                 pair, roles, pids, epochs, versions, pool use, weights, transitions
  promote                graceful switch-over: drain the primary, promote the standby
  drain                  take the pair out of service (the primary finishes its requests)
  drill kill|hang|error  kill -9 the primary, freeze its cgroup (else SIGSTOP its group), or make it
                         report an error
  upgrade [--steps 10,50,100] [--step-ms N] [--min-requests N] -- CMD ARGS...
                         canary upgrade to a new engine command (same placeholders as
                         engine.command; or --engine-cmd "CMD"): it takes the standby's
                         place, serves a growing share, and is promoted or rolled back
  rollback [--steps ...] [--step-ms N] [--min-requests N]
                         roll the canary back; with no upgrade running, upgrade back to
                         the command the last promoted upgrade replaced (by a canary)
  timeline               the last failover, phase by phase

options:
  --json                 print one JSON object as the last line
  --socket PATH          controller socket (default $BATON_RUNTIME_DIR/controller.sock,
                         or /tmp/baton-<uid>/controller.sock)
  --timeout-ms N         how long to wait for the controller (default 10000)
exit status: 0 done, 1 refused (the reason is printed), 2 bad usage
)";
}

}  // namespace baton
