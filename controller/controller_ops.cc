// Controller: operator commands, periodic checks, routes and invariants.
#include <signal.h>

#include "base/log.h"
#include "controller/controller.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

uint32_t Millis(Duration d) {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

}  // namespace

// --- operator commands --------------------------------------------------------------------------

Status Controller::RequestSwitchover() {
  if (stopping_) return Unavailable("the controller is shutting down");
  EngineRecord* p = Find(primary_);
  EngineRecord* s = Standby();
  const std::string pair = ToString(pair_.state());
  if (p == nullptr || !p->serving) {
    return FailedPrecondition("no serving primary to switch over from (pair is " + pair + ")");
  }
  if (upgrade_.has_value()) {
    return FailedPrecondition("an upgrade is in progress; `batonctl rollback` ends it");
  }
  if (s == nullptr) return FailedPrecondition("no ready standby to promote (pair is " + pair + ")");
  BATON_RETURN_IF_ERROR(CheckNoCalledOffDrain(*p));
  Result<PairState> applied = pair_.Apply(PairEvent::kGracefulPromoteRequested);
  if (!applied.ok()) return applied.status();
  OpenPlannedTimeline("switchover", "batonctl promote", *p, s->id);
  BATON_LOG(INFO, kLog) << "switch-over: draining engine " << p->id << ", then promoting engine "
                        << s->id;
  DrainEngine(*p);
  PublishRoutes();
  return OkStatus();
}

PromotionRecord& Controller::OpenPlannedTimeline(const std::string& kind, const std::string& cause,
                                                 const EngineRecord& old, EngineId next) {
  PromotionRecord& r = timelines_.Open(kind, cause);
  r.injected = clock_.Now();
  r.old_engine = old.id;
  r.old_pid = old.process.pid();
  r.new_engine = next;
  return r;
}

void Controller::DrainEngine(EngineRecord& e) {
  if (e.machine.Allows(EngineEvent::kDrain)) (void)e.machine.Apply(EngineEvent::kDrain);
  e.serving = false;
  e.deadline = clock_.Now() + config_.drain_timeout;
  Status sent = e.channel->Send(proto::Drain{.epoch = ledger_->engine(e.id)->epoch,
                                             .timeout_ms = Millis(config_.drain_timeout)});
  if (!sent.ok()) Fail(e.id, FailCause::kEof, "sending Drain: " + sent.message());
}

void Controller::GrantFree(EngineRecord& e, uint32_t blocks, const char* who) {
  const uint64_t epoch = ledger_->engine(e.id)->epoch;
  Result<std::vector<Extent>> granted = ledger_->Grant(e.id, blocks, epoch);
  if (!granted.ok()) {
    BATON_LOG(ERROR, kLog) << "granting " << blocks << " blocks to engine " << e.id << " (" << who
                           << "): " << granted.status().ToString();
    return;
  }
  BATON_LOG(INFO, kLog) << "granted " << blocks << " free blocks to engine " << e.id << " (" << who
                        << ")";
  Status sent = e.channel->Send(proto::Grant{.epoch = epoch, .extents = ToRanges(*granted)});
  if (!sent.ok()) Fail(e.id, FailCause::kEof, "sending Grant: " + sent.message());
  CheckInvariants();
}

Status Controller::CheckNoCalledOffDrain(const EngineRecord& primary) const {
  if (primary.called_off_drains == 0) return OkStatus();
  return Unavailable("engine " + std::to_string(primary.id) +
                     " still finishes the drain that was called off; try again in a moment");
}

void Controller::CallOffSwitchover(EngineRecord& standby) {
  EngineRecord* p = Find(primary_);
  if (p == nullptr || !p->live() || !p->is(EngineState::kDraining)) return;
  const std::string why = "engine " + std::to_string(standby.id) + ", the standby, failed (" +
                          standby.fail_reason + ")";
  if (p->channel == nullptr || p->channel->version() < proto::kProtocolVersionResume) {
    BATON_LOG(WARN, kLog) << "switch-over: " << why << "; engine " << p->id << " speaks protocol "
                          << (p->channel != nullptr ? p->channel->version() : 0)
                          << ", which cannot call a drain off: it is retired once drained";
    return;
  }
  (void)p->machine.Apply(EngineEvent::kDrainCancelled);
  p->serving = true;
  p->deadline.reset();
  ++p->called_off_drains;
  ++called_off_switchovers_;
  Status sent = p->channel->Send(proto::Resume{.epoch = ledger_->engine(p->id)->epoch});
  if (!sent.ok()) return Fail(p->id, FailCause::kEof, "sending Resume: " + sent.message());
  timelines_.Close("called off: " + why + "; engine " + std::to_string(p->id) + " serves on");
  BATON_LOG(INFO, kLog) << "switch-over called off: " << why << "; engine " << p->id
                        << " serves again";
}

Status Controller::RequestDrain() {
  if (stopping_) return Unavailable("the controller is shutting down");
  if (upgrade_.has_value()) {
    return FailedPrecondition("an upgrade is in progress; `batonctl rollback` ends it first");
  }
  if (EngineRecord* p = Find(primary_); p != nullptr) {
    BATON_RETURN_IF_ERROR(CheckNoCalledOffDrain(*p));
  }
  Result<PairState> applied = pair_.Apply(PairEvent::kDrain);
  if (!applied.ok()) return applied.status();
  std::vector<EngineId> others;
  for (const auto& [id, e] : engines_) {
    if (e->live() && id != primary_) others.push_back(id);
  }
  for (EngineId id : others) Fail(id, FailCause::kShutdown, "the pair is being drained");
  if (EngineRecord* p = Find(primary_); p != nullptr && p->live()) DrainEngine(*p);
  BATON_LOG(INFO, kLog) << "drain: the pair is taken out of service";
  PublishRoutes();
  return OkStatus();
}

namespace {

// Stops everything `e` started, as a whole engine that hangs would: its cgroup frozen, or its
// process group (its workers, or the engine a wrapper ran) stopped where it has no cgroup or
// the freeze fails. Returns how, for the log.
Result<std::string> HangEngine(EngineRecord& e) {
  if (e.cgroup != nullptr) {
    Status frozen = e.cgroup->Freeze();
    if (frozen.ok()) return std::string(" by freezing its cgroup");
    BATON_LOG(WARN, kLog) << "engine " << e.id << ": " << frozen.ToString()
                          << "; stopping its process group instead";
  }
  BATON_RETURN_IF_ERROR(e.process.SignalGroup(SIGSTOP));
  return std::string(" by stopping its process group");
}

}  // namespace

Status Controller::Drill(const std::string& kind) {
  if (stopping_) return Unavailable("the controller is shutting down");
  if (upgrade_.has_value()) {
    return FailedPrecondition("an upgrade is in progress; drill once it has ended");
  }
  EngineRecord* p = Find(primary_);
  if (p == nullptr || !p->serving) {
    return FailedPrecondition(std::string("no serving primary to drill (pair is ") +
                              ToString(pair_.state()) + ")");
  }
  Status status = OkStatus();
  std::string how;
  if (kind == "kill") {
    status = p->process.Signal(SIGKILL);
  } else if (kind == "hang") {
    Result<std::string> hung = HangEngine(*p);
    status = hung.status();
    if (hung.ok()) how = *hung;
  } else if (kind == "error") {
    status = p->channel->Send(proto::InjectFault{.kind = "error", .message = "batonctl drill"});
  } else {
    return InvalidArgument("unknown drill '" + kind + "' (kill, hang or error)");
  }
  if (!status.ok()) return status;
  drill_ = DrillRecord{kind, p->id, clock_.Now()};
  BATON_LOG(INFO, kLog) << "drill " << kind << " on engine " << p->id << " (pid "
                        << p->process.pid() << ")" << how;
  return OkStatus();
}

// --- periodic checks
// ------------------------------------------------------------------------------

void Controller::PollEngines() {
  const TimePoint now = clock_.Now();
  struct Failure {
    EngineId id;
    FailCause cause;
    std::string detail;
  };
  std::vector<Failure> failures;
  for (auto& [id, e] : engines_) {
    if (!e->live()) continue;
    if (e->deadline.has_value() && now >= *e->deadline) {
      if (e->is(EngineState::kLaunching)) {
        failures.push_back({id, FailCause::kTimeout, "did not register in time"});
      } else if (e->is(EngineState::kPromoting)) {
        failures.push_back({id, FailCause::kTimeout, "did not acknowledge its promotion in time"});
      } else if (e->is(EngineState::kDraining)) {
        failures.push_back({id, FailCause::kPlanned, "drain timed out"});
      }
      e->deadline.reset();
    }
    if (!e->detector.has_value()) continue;
    switch (e->detector->Poll()) {
      case FailureDetector::Action::kSendProbe:
        ++e->probes;
        BATON_LOG(WARN, kLog) << "engine " << id << " silent for "
                              << MillisBetween(e->last_heartbeat, now)
                              << " ms: health request sent";
        if (e->channel != nullptr) (void)e->channel->Send(proto::HealthRequest{.seq = e->probes});
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
  for (const Failure& f : failures) Fail(f.id, f.cause, f.detail);
}

void Controller::PublishRoutes() {
  proto::RouteTable table;
  table.pair_state = ToString(pair_.state());
  for (const auto& [id, e] : engines_) {
    if (!e->live()) continue;
    proto::RouteEntry entry{.engine_id = id,
                            .role = "",
                            .http_address = e->http_address,
                            .ready = e->serving,
                            .weight = e->serving ? 100u : 0u,
                            .engine_version = e->version};
    if (id == primary_) {
      entry.role = e->is(EngineState::kDraining) ? "draining" : "primary";
      if (const LedgerEngine* le = ledger_->engine(id)) table.epoch = le->epoch;
    } else if (id == promoting_) {
      entry.role = "promoting";
    } else if (e->is(EngineState::kStandby)) {
      entry.role = "standby";
    } else if (IsCanary(id)) {
      entry.role = e->is(EngineState::kPromoting) ? "promoting"
                   : e->serving                   ? "canary"
                                                  : "draining";
      entry.weight = e->serving && upgrade_->judge.has_value() ? upgrade_->judge->weight() : 0;
    } else {
      continue;
    }
    table.entries.push_back(std::move(entry));
  }
  for (proto::RouteEntry& entry : table.entries) {  // the primary serves what the canary does not
    if (entry.engine_id != primary_ || !upgrade_.has_value()) continue;
    for (const proto::RouteEntry& c : table.entries) {
      if (c.role == "canary" && c.ready) entry.weight = 100 - c.weight;
    }
  }
  if (!routes_.Publish(std::move(table))) return;
  PromotionRecord* r = timelines_.current();
  if (r != nullptr && r->promote_acked.has_value() && !r->route_published.has_value()) {
    r->route_published = clock_.Now();
  }
}

void Controller::CheckInvariants() {
  if (invariants_ != "ok") return;  // the first violation stays for `batonctl status`
  Status status = ledger_->CheckInvariants();
  if (status.ok()) return;
  invariants_ = status.message();
  BATON_LOG(ERROR, kLog) << "fencing invariant violated: " << invariants_;
}

void Controller::ApplyPair(PairEvent event) { (void)pair_.Apply(event); }

Result<uint64_t> Controller::AdvanceEpoch() {
  Result<uint64_t> epoch = journal_->Advance();
  if (!epoch.ok()) {
    BATON_LOG(ERROR, kLog) << "cannot make a new epoch durable, promotions are held: "
                           << epoch.status().ToString();
  }
  NoteJournalState();
  return epoch;
}

void Controller::NoteJournalState() {
  const bool failing = !journal_->last_write().ok();
  if (journal_failing_ && !failing) {
    BATON_LOG(INFO, kLog) << "epoch journal can be written again (" << journal_->write_failures()
                          << " writes failed since the start)";
  }
  journal_failing_ = failing;
}

}  // namespace baton
