// StatusText (ctl_service.h): `batonctl status` as an operator reads it, rendered from
// StatusJson: the pair, its engines, the controller, routes, refusals, exits and transitions.
#include <iomanip>
#include <sstream>

#include "controller/ctl/ctl_fleet.h"
#include "controller/ctl/ctl_service.h"
#include "controller/ctl/degradations.h"
#include "controller/upgrade/ctl_upgrade.h"
#include "proto/roles.h"

namespace baton {
namespace {

using nlohmann::json;

// "11.34": milliseconds as every duration of batonctl's text, to 2 decimals.
std::string Ms(double ms) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(2) << ms;
  return text.str();
}

// "1 failure", "3 failures".
std::string Failures(int64_t n) { return std::to_string(n) + (n == 1 ? " failure" : " failures"); }

// The crash-loop guard's line: the failures in its window and how many trip it; in backoff,
// what tripped it, when the next restart may start and the failures since the trip.
std::string GuardText(const json& g) {
  std::ostringstream window;
  window << g["window_s"].get<double>();
  const int64_t recent = g["recent_failures"].get<int64_t>();
  std::ostringstream out;
  out << "crash-loop guard: ";
  if (g["in_backoff"].get<bool>()) {
    out << "in backoff, tripped by " << Failures(g["max_failures"].get<int64_t>()) << " in "
        << window.str() << " s, level " << g["level"] << "; next restart in "
        << Ms(g["next_restart_in_ms"].get<double>()) << " ms; " << Failures(recent) << " since";
  } else {
    out << Failures(recent) << " in the last " << window.str() << " s (it trips at "
        << g["max_failures"] << "), level " << g["level"];
  }
  out << "\n";
  return out.str();
}

// How the weight arena is paged: all 2 MiB, all 4 KiB, or partial (bytes on each). A status
// from a controller that does not report the split says only whether it has huge pages.
std::string ArenaPagesText(const json& w) {
  if (!w.contains("huge_bytes")) return w["huge_pages"].get<bool>() ? "huge pages" : "4 KiB pages";
  const uint64_t huge = w["huge_bytes"].get<uint64_t>(), small = w["small_bytes"].get<uint64_t>();
  if (small == 0) return "huge pages";
  if (huge == 0) return "4 KiB pages";
  return "partial huge pages (" + std::to_string(huge) + " B on 2 MiB pages, " +
         std::to_string(small) + " B on 4 KiB pages)";
}

// How the arena got its bytes: read at a speed, or adopted from baton-keeper (nothing read).
// A status from a controller that does not report bytes_read says only the speed.
std::string LoadText(const json& w) {
  if (w.value("bytes_read", uint64_t{1}) == 0) return "adopted (no byte read)";
  std::ostringstream text;
  text << "loaded at " << std::fixed << std::setprecision(2) << w["load_gbps"].get<double>()
       << " GB/s";
  return text.str();
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
    out << "exit: engine " << x["id"] << " pid " << x["pid"] << " (launched as "
        << x["launched_as"].get<std::string>() << "): " << x["cause"].get<std::string>() << ", "
        << x["exit"].get<std::string>() << " (" << static_cast<int64_t>(x["ms_ago"].get<double>())
        << " ms ago)\n";
  }
}

// The controller's own line: its incarnation and what its start re-adopted.
void ControllerText(const ControllerStatus& c, std::ostringstream& out) {
  const RecoveryStatus& r = c.core.recovery;
  out << "controller pid " << c.pid << ", up "
      << static_cast<int64_t>(MillisBetween(c.started_at, c.core.now)) << " ms, incarnation "
      << c.core.incarnation << " (" << c.restarts << " restarts)";
  if (r.restarted) {
    out << (r.in_progress ? "; re-adopting: " : "; re-adopted ") << r.readopted.size()
        << " engines, fenced " << r.fenced.size() << ", gone " << r.gone.size() << ", "
        << (r.memory == "adopted" ? "weights and pool adopted" : "memory: " + r.memory);
    if (r.readopt_ms.has_value()) out << ", pair ready in " << Ms(*r.readopt_ms) << " ms";
  }
  out << "\n";
  for (const RecoveryStatus::Fenced& f : r.fenced) {
    out << "  fenced at restart: engine " << f.id << ": " << f.reason << "\n";
  }
  for (const RecoveryStatus::Fenced& g : r.gone) {
    out << "  gone at restart: engine " << g.id << ": " << g.reason << "\n";
  }
  for (int pid : r.holders_killed) {
    out << "  killed at start: pid " << pid
        << " held the kept memory and no roster accounted for it\n";
  }
}

}  // namespace

std::string StatusText(const ControllerStatus& c) {
  const json s = StatusJson(c);
  std::ostringstream out;
  out << "pair " << s["pair"]["state"].get<std::string>() << ", epoch " << s["epoch"]["durable"]
      << ", invariants " << s["invariants"].get<std::string>() << "\n";
  ControllerText(c, out);
  for (const json& e : s["engines"]) {
    // A launched engine is launching until it registers, then registering until StandbyReady.
    const std::string role = e["role"].get<std::string>();
    out << "  engine " << e["id"] << " "
        << (role == proto::ToString(proto::EngineRole::kLaunching) ? e["state"].get<std::string>()
                                                                   : role)
        << " pid " << e["pid"] << " epoch " << e["epoch"] << " blocks " << e["blocks"]
        << " version " << e["version"].get<std::string>() << " "
        << e["http_address"].get<std::string>();
    // CUDA backend: whether it took the device regions, or why not.
    if (e.contains("device_memory") && !e["device_memory"].get<std::string>().empty()) {
      out << " device memory " << e["device_memory"].get<std::string>();
    }
    out << "\n";
  }
  const json& p = s["pool"];
  out << "pool " << p["blocks"] << " blocks x " << p["block_bytes"] << " B: " << p["granted"]
      << " granted, " << p["quarantined"] << " quarantined, " << p["free"] << " free"
      << (p["huge_pages"].get<bool>() ? " (huge pages)" : " (normal pages)") << "\n";
  const json& reserve = p["promotion_reserve"];
  if (c.core.reserve_target > 0) {
    out << "promotion reserve " << reserve["available"] << " of " << reserve["target"]
        << " blocks: a failover promotes the standby before the old primary's barrier"
        << (c.core.reserve_available < c.core.reserve_target
                ? " once the reserve is whole again (until then it waits for the barrier)"
                : "")
        << "\n";
  } else {
    out << "no promotion reserve: " << c.core.reserve_note << "\n";
  }
  const json& w = s["weights"];
  out << "weights " << w["model_dir"].get<std::string>() << ": " << w["tensors"] << " tensors, "
      << w["resident_bytes"] << " of " << w["arena_bytes"] << " B resident, numa node "
      << w["numa_node"] << ", " << ArenaPagesText(w)
      << (w["locked"].get<bool>() ? ", locked" : ", not locked") << ", " << LoadText(w) << "\n";
  const json& k = s["controller"]["keeper"];
  out << "keeper: " << k["state"].get<std::string>();
  if (k["pid"].get<int>() > 0) out << " (pid " << k["pid"] << ")";
  if (k["restarts"].get<uint64_t>() > 0) out << ", restarted " << k["restarts"] << " times";
  if (!k["detail"].get<std::string>().empty()) out << ": " << k["detail"].get<std::string>();
  out << "\n";
  out << DegradationText(c);
  RoutesAndHistoryText(s, out);
  const CoordinatorStatus& core = c.core;
  if (c.device.present) out << "device memory: " << c.device.describe << "\n";
  if (core.cuda_backend && !c.device.present) {
    out << "device memory: LOST (" << core.device_lost_reason << "), rebuilding; engines held\n";
  }
  if (core.device_losses > 0) {
    out << "device losses: " << core.device_losses << ", rebuilds: " << core.device_rebuilds
        << ", last: " << core.device_lost_reason << "\n";
  }
  if (!c.journal.last_write.ok()) {
    const uint64_t left = c.journal.reserved - c.journal.durable;
    out << "epoch journal: CANNOT WRITE (" << c.journal.last_write.ToString() << "); "
        << (left == 0 ? std::string("new epochs are held")
                      : std::to_string(left) + " reserved epochs left");
    for (EngineId id : core.unfenced_reaped) out << "; engine " << id << " waits to be fenced";
    out << "\n";
  }
  out << FleetText(c);
  if (core.refused_transitions > 0) {
    out << "BUG: " << core.refused_transitions << " state transitions were refused (see the log)\n";
  }
  out << UpgradeText(c);
  out << "fencing: "
      << (!c.cgroup_base.empty() ? "a cgroup per engine under " + c.cgroup_base
                                 : "process groups only (" + c.cgroups_off_reason + ")")
      << "\n";
  out << GuardText(s["crash_loop"]);
  out << "recent transitions:\n";
  for (const json& t : s["transitions"]) {
    out << "  " << t["at"].get<std::string>() << " " << t["machine"].get<std::string>() << ": "
        << t["from"].get<std::string>() << " -> " << t["to"].get<std::string>() << " on "
        << t["event"].get<std::string>() << "\n";
  }
  return out.str();
}

}  // namespace baton
