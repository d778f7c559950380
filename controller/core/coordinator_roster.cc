// EnginePart: the roster it writes, the route table it publishes, the engines' health it polls.
#include <algorithm>

#include "base/log.h"
#include "controller/core/coordinator_parts.h"

namespace baton {

namespace {

constexpr const char* kLog = "controller";
// The fence reason of an engine that registered and then did not say it was ready in time.
constexpr const char* kRegisteredNeverReady =
    "registered but did not say it was ready (StandbyReady) within register_timeout_ms (an "
    "engine connected with ready_when_waiting says so only at its first wait for promotion)";

RosterRole RosterRoleOf(const EngineRecord& e) {
  switch (e.state()) {
    case EngineState::kStandby:
      return RosterRole::kStandby;
    case EngineState::kPromoting:
      return RosterRole::kPromoting;
    case EngineState::kPrimary:
      return RosterRole::kServing;
    case EngineState::kDraining:
      return RosterRole::kDraining;
    case EngineState::kFencing:
    case EngineState::kDead:
      return RosterRole::kFencing;
    default:
      return RosterRole::kLaunching;
  }
}

}  // namespace

// A previous controller's engine the ledger holds nothing for (fenced as unaccounted for, or
// gone before its barrier): it may map what the previous roster gave it, held back for it.
void EnginePart::HoldBack(const Roster* previous, EngineId id, RosterEngine& entry) const {
  const RosterEngine* was = previous != nullptr ? previous->Find(id) : nullptr;
  if (was == nullptr || s_.ledger->engine(id) != nullptr) return;
  entry.epoch = was->epoch;
  entry.extents = was->extents;
}

Roster EnginePart::MakeRoster() const {
  Roster r;
  r.incarnation = s_.incarnation;
  r.next_engine_id = s_.next_engine_id;
  r.primary = s_.primary;
  r.pair_draining =
      s_.pair.state() == PairState::kDraining || s_.pair.state() == PairState::kStopped;
  // While recovering, an engine that has not reattached yet is still what the previous
  // controller's roster says (its role, epoch and extents, and whether it is the primary).
  const Roster* previous = p_.recovery->active() ? &p_.recovery->own().recovery->roster : nullptr;
  // A drain goes on through a recovery (the pair is recovering, not draining, meanwhile).
  if (previous != nullptr && previous->pair_draining) r.pair_draining = true;
  if (previous != nullptr && s_.primary == kNoEngine) {
    const EngineRecord* p = s_.Find(previous->primary);
    if (p != nullptr && p->is(EngineState::kAdopting)) r.primary = previous->primary;
  }
  for (const auto& [id, e] : s_.engines) {
    if (e->pid == 0) continue;  // not started: nothing can reattach as it
    RosterEngine entry{.id = id,
                       .pid = e->pid,
                       .start_time = 0,
                       .token = e->token,
                       .launch_role = e->launch_role,
                       .port = e->port,
                       .command = e->command,
                       .cgroup = "",
                       .role = RosterRoleOf(*e),
                       .epoch = 0,
                       .extents = {},
                       .version = e->version,
                       .http_address = e->http_address,
                       .device_memory = e->device_memory};
    if (const LedgerEngine* le = s_.ledger->engine(id); le != nullptr) entry.epoch = le->epoch;
    // Quarantined leases too: a fenced engine still maps them until it is gone.
    for (const Lease& l : s_.ledger->LeasesOf(id)) entry.extents.push_back(l.extent);
    if (const RosterEngine* was =
            previous != nullptr && e->is(EngineState::kAdopting) ? previous->Find(id) : nullptr;
        was != nullptr) {
      entry.role = was->role;
      entry.epoch = was->epoch;
      entry.extents = was->extents;
    } else {
      HoldBack(previous, id, entry);  // fenced as unaccounted for
    }
    r.engines.push_back(std::move(entry));
  }
  // Engines already reaped whose barrier has not passed yet: a controller restarted from here
  // on must wait for it too before their blocks (its previous incarnation's) move.
  auto gone = [&](EngineId id, pid_t pid) {
    if (s_.engines.count(id) != 0 || r.Find(id) != nullptr) return;
    RosterEngine entry;
    entry.id = id;
    entry.pid = pid;
    entry.role = RosterRole::kFencing;
    if (const LedgerEngine* le = s_.ledger->engine(id); le != nullptr) entry.epoch = le->epoch;
    for (const Lease& l : s_.ledger->LeasesOf(id)) entry.extents.push_back(l.extent);
    HoldBack(previous, id, entry);
    r.engines.push_back(std::move(entry));
  };
  for (const auto& [id, wait] : p_.failover->own().barrier_waits) gone(id, wait.pid);
  for (const auto& [id, pid] : p_.failover->own().unfenced_reaped) gone(id, pid);
  if (p_.recovery->active()) {
    for (const auto& [id, until] : p_.recovery->own().recovery->gone) {
      const RosterEngine* was = p_.recovery->own().recovery->roster.Find(id);
      gone(id, was != nullptr ? was->pid : 0);
    }
  }
  return r;
}

void EnginePart::SaveRoster() {
  if (Status saved = s_.effects.SaveRoster(MakeRoster()); !saved.ok()) {
    BATON_LOG(ERROR, kLog) << "the roster is not saved (a restarted controller would fence "
                              "engines it cannot account for): "
                           << saved.ToString();
  }
}

// --- routes and the engines' health -------------------------------------------------------------

void EnginePart::PublishRoutes() {
  if (p_.recovery->active() && s_.primary == kNoEngine) {
    return;  // the routers keep the previous controller's table until its primary is back
  }
  proto::RouteTable table;
  table.pair_state = s_.stopping ? "stopping" : ToString(s_.pair.state());
  for (const auto& [id, e] : s_.engines) {
    // A controller that stops stops its engines: the routers stop sending them requests (their
    // /health says so) rather than find them gone.
    if (s_.stopping || !e->live() || !e->registered()) continue;
    proto::RouteEntry entry{.engine_id = id,
                            .role = proto::EngineRole::kStandby,
                            .http_address = e->http_address,
                            .ready = e->serving(),
                            .weight = e->serving() ? 100u : 0u,
                            .engine_version = e->version};
    if (id == s_.primary) {
      entry.role = e->is(EngineState::kDraining) ? proto::EngineRole::kDraining
                                                 : proto::EngineRole::kPrimary;
      if (const LedgerEngine* le = s_.ledger->engine(id)) table.epoch = le->epoch;
    } else if (id == s_.promoting) {
      entry.role = proto::EngineRole::kPromoting;
    } else if (e->is(EngineState::kStandby)) {
      entry.role = proto::EngineRole::kStandby;
    } else if (p_.upgrades->IsCanary(id)) {
      entry.role = e->is(EngineState::kPromoting) ? proto::EngineRole::kPromoting
                   : e->serving()                 ? proto::EngineRole::kCanary
                                                  : proto::EngineRole::kDraining;
      entry.weight = e->serving() && p_.upgrades->own().upgrade->judge.has_value()
                         ? p_.upgrades->own().upgrade->judge->weight()
                         : 0;
    } else {
      continue;
    }
    table.entries.push_back(std::move(entry));
  }
  for (proto::RouteEntry& entry : table.entries) {  // the primary serves what the canary does not
    if (entry.engine_id != s_.primary || !p_.upgrades->active()) continue;
    for (const proto::RouteEntry& c : table.entries) {
      if (c.role == proto::EngineRole::kCanary && c.ready) entry.weight = 100 - c.weight;
    }
  }
  if (!s_.effects.PublishRoutes(std::move(table))) return;
  PromotionRecord* r = s_.timelines.current();
  if (r != nullptr && r->promote_acked.has_value() && !r->route_published.has_value()) {
    r->route_published = s_.clock.Now();
  }
}

bool EnginePart::ProgressJudged(const EngineRecord& e) const {
  return e.progress.has_value() && e.serving() &&
         (e.id == s_.primary || p_.upgrades->IsCanary(e.id));
}

std::optional<TimePoint> EnginePart::ProgressDeadline(const EngineRecord& e) const {
  return ProgressJudged(e) ? e.progress->NextDeadline() : std::nullopt;
}

std::optional<std::string> EnginePart::ComputeStall(const EngineRecord& e) const {
  if (!ProgressJudged(e) || !e.progress->Stalled()) return std::nullopt;
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  return "compute stalled: no step finished for " +
         std::to_string(duration_cast<milliseconds>(e.progress->still_for()).count()) +
         " ms with " + std::to_string(e.progress->work_pending()) + " requests pending (" +
         std::to_string(e.progress->steps_done()) + " steps done; compute_stall_timeout_ms " +
         std::to_string(duration_cast<milliseconds>(s_.config.compute_stall_timeout).count()) + ")";
}

void EnginePart::PollEngines() {
  const TimePoint now = s_.clock.Now();
  struct Failure {
    EngineId id;
    FailCause cause;
    std::string detail;
  };
  std::vector<Failure> failures;
  std::vector<EngineId> probes;
  size_t silent = 0;
  for (const auto& [id, e] : s_.engines)
    silent += e->live() && e->detector && e->detector->Silent();
  for (auto& [id, e] : s_.engines) {
    if (!e->live()) continue;
    if (e->deadline.has_value() && now >= *e->deadline) {
      if (e->is(EngineState::kLaunching)) {
        failures.push_back({id, FailCause::kTimeout, "did not register in time"});
      } else if (e->is(EngineState::kRegistering)) {
        failures.push_back({id, FailCause::kTimeout, kRegisteredNeverReady});
      } else if (e->is(EngineState::kPromoting)) {
        failures.push_back({id, FailCause::kTimeout, "did not acknowledge its promotion in time"});
      } else if (e->is(EngineState::kDraining)) {
        failures.push_back({id, FailCause::kPlanned, "drain timed out"});
      }
      e->deadline.reset();
    }
    if (std::optional<std::string> stall = ComputeStall(*e); stall.has_value()) {
      ++s_.compute_stalls;
      failures.push_back({id, FailCause::kHung, *std::move(stall)});
      continue;
    }
    if (!e->detector.has_value()) continue;
    const bool others_silent = silent > (e->detector->Silent() ? 1u : 0u);
    switch (e->detector->Poll(others_silent)) {
      case FailureDetector::Action::kSendProbe:
        ++e->probes;
        BATON_LOG(WARN, kLog) << "engine " << id << " silent for "
                              << MillisBetween(e->last_heartbeat, now)
                              << " ms: health request sent";
        probes.push_back(id);
        break;
      case FailureDetector::Action::kProbeAgain:
        ++e->probes;
        BATON_LOG(WARN, kLog) << "engine " << id << ": "
                              << (others_silent ? "another engine is silent too (the host stalled?)"
                                                : "the hang verdict came late (the controller "
                                                  "stalled)")
                              << ", health request sent again";
        probes.push_back(id);
        break;
      case FailureDetector::Action::kDeclareHung:
        failures.push_back(
            {id, FailCause::kHung,
             "no heartbeat for " +
                 std::to_string(static_cast<int>(MillisBetween(e->last_heartbeat, now))) +
                 " ms and no answer to the health request"});
        break;
      case FailureDetector::Action::kNone:
        break;
    }
  }
  for (EngineId id : probes) {
    const EngineRecord& e = s_.Get(id);
    if (e.connected) (void)s_.effects.Send(id, proto::HealthRequest{.seq = e.probes});
  }
  // The primary last: its fence promotes the standby, which must not be one failing too.
  std::stable_partition(failures.begin(), failures.end(),
                        [this](const Failure& f) { return f.id != s_.primary; });
  for (const Failure& f : failures) p_.failover->Fence(f.id, f.cause, f.detail);
}

}  // namespace baton
