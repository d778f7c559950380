// Coordinator: operator commands, periodic checks, routes, epochs and invariants.
#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

uint32_t Millis(Duration d) {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

}  // namespace

// --- operator commands --------------------------------------------------------------------------

Status Coordinator::RequestSwitchover() {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  EngineRecord* p = s_.Find(s_.primary);
  EngineRecord* s = s_.Standby();
  const std::string pair = ToString(s_.pair.state());
  if (p == nullptr || !p->serving()) {
    return FailedPrecondition("no serving primary to switch over from (pair is " + pair + ")");
  }
  if (upgrade_.has_value()) {
    return FailedPrecondition("an upgrade is in progress; `batonctl rollback` ends it");
  }
  if (s == nullptr) return FailedPrecondition("no ready standby to promote (pair is " + pair + ")");
  BATON_RETURN_IF_ERROR(CheckNoCalledOffDrain(*p));
  Result<PairState> applied = s_.pair.Apply(PairEvent::kGracefulPromoteRequested);
  if (!applied.ok()) return applied.status();
  OpenPlannedTimeline(PromotionKind::kSwitchover, "batonctl promote", *p, s->id);
  BATON_LOG(INFO, kLog) << "switch-over: draining engine " << p->id << ", then promoting engine "
                        << s->id;
  DrainEngine(*p);
  BATON_FAILPOINT("mid_switchover");  // the primary told to drain
  PublishRoutes();
  return OkStatus();
}

PromotionRecord& Coordinator::OpenPlannedTimeline(PromotionKind kind, const std::string& cause,
                                                  const EngineRecord& old, EngineId next) {
  PromotionRecord& r = s_.timelines.Open(kind, cause);
  r.injected = s_.clock.Now();
  r.old_engine = old.id;
  r.old_pid = old.pid;
  r.new_engine = next;
  return r;
}

void Coordinator::DrainEngine(EngineRecord& e) {
  s_.Step(e.machine, EngineEvent::kDrain);
  e.deadline = s_.clock.Now() + s_.config.drain_timeout;
  SaveRoster();
  SendOrFail(e, proto::Drain{.epoch = s_.ledger->engine(e.id)->epoch,
                             .timeout_ms = Millis(s_.config.drain_timeout)});
}

bool Coordinator::ResumeEngine(EngineRecord& e) {
  if (!e.is(EngineState::kDraining) || !e.connected || e.protocol < proto::kProtocolVersionResume) {
    return false;
  }
  s_.Step(e.machine, EngineEvent::kDrainCancelled);
  e.deadline.reset();
  ++e.called_off_drains;
  SaveRoster();
  return SendOrFail(e, proto::Resume{.epoch = s_.ledger->engine(e.id)->epoch});
}

bool Coordinator::SendOrFail(EngineRecord& e, const ToEngine& message) {
  const Status sent = s_.effects.Send(e.id, message);
  if (sent.ok()) return true;
  Fail(e.id, FailCause::kEof,
       std::string("sending ") + ToEngineName(message) + ": " + sent.message());
  return false;
}

void Coordinator::GrantFree(EngineRecord& e, uint32_t blocks, const char* who) {
  const uint64_t epoch = s_.ledger->engine(e.id)->epoch;
  Result<std::vector<Extent>> granted = s_.ledger->Grant(e.id, blocks, epoch);
  if (!granted.ok()) {
    BATON_LOG(ERROR, kLog) << "granting " << blocks << " blocks to engine " << e.id << " (" << who
                           << "): " << granted.status().ToString();
    return;
  }
  SaveRoster();                    // before the engine can map them
  BATON_FAILPOINT("after_grant");  // granted and in the roster, not sent
  BATON_LOG(INFO, kLog) << "granted " << blocks << " free blocks to engine " << e.id << " (" << who
                        << ")";
  SendOrFail(e, proto::Grant{.epoch = epoch, .extents = ToRanges(*granted)});
  s_.CheckInvariants();
}

Status Coordinator::CheckNoCalledOffDrain(const EngineRecord& primary) const {
  if (primary.called_off_drains == 0) return OkStatus();
  return Unavailable("engine " + std::to_string(primary.id) +
                     " still finishes the drain that was called off; try again in a moment");
}

void Coordinator::CallOffSwitchover(EngineRecord& standby) {
  EngineRecord* p = s_.Find(s_.primary);
  if (p == nullptr || !p->live() || !p->is(EngineState::kDraining)) return;
  const std::string why = "engine " + std::to_string(standby.id) + ", the standby, failed (" +
                          standby.fail_reason + ")";
  if (!p->connected || p->protocol < proto::kProtocolVersionResume) {
    BATON_LOG(WARN, kLog) << "switch-over: " << why << "; engine " << p->id << " speaks protocol "
                          << p->protocol
                          << ", which cannot call a drain off: it is retired once drained";
    return;
  }
  ++s_.called_off_switchovers;
  if (!ResumeEngine(*p)) return;
  s_.timelines.Close("called off: " + why + "; engine " + std::to_string(p->id) + " serves on");
  BATON_LOG(INFO, kLog) << "switch-over called off: " << why << "; engine " << p->id
                        << " serves again";
}

Status Coordinator::RequestDrain() {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  if (upgrade_.has_value()) {
    return FailedPrecondition("an upgrade is in progress; `batonctl rollback` ends it first");
  }
  if (EngineRecord* p = s_.Find(s_.primary); p != nullptr) {
    BATON_RETURN_IF_ERROR(CheckNoCalledOffDrain(*p));
  }
  Result<PairState> applied = s_.pair.Apply(PairEvent::kDrain);
  if (!applied.ok()) return applied.status();
  std::vector<EngineId> others;
  for (const auto& [id, e] : s_.engines) {
    if (e->live() && id != s_.primary) others.push_back(id);
  }
  for (EngineId id : others) Fail(id, FailCause::kShutdown, "the pair is being drained");
  if (EngineRecord* p = s_.Find(s_.primary); p != nullptr && p->live()) DrainEngine(*p);
  BATON_LOG(INFO, kLog) << "drain: the pair is taken out of service";
  SaveRoster();
  PublishRoutes();
  return OkStatus();
}

Status Coordinator::RequestResume() {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  const PairState s = s_.pair.state();
  if (s == PairState::kDraining) {
    EngineRecord* p = s_.Find(s_.primary);
    if (p == nullptr || !p->live() || !p->is(EngineState::kDraining)) {
      return Unavailable("the drain is ending; resume once the pair is stopped");
    }
    if (!ResumeEngine(*p)) {
      return FailedPrecondition("engine " + std::to_string(p->id) + " speaks protocol " +
                                std::to_string(p->protocol) +
                                ", which cannot call a drain off; resume once the pair is stopped");
    }
    s_.StepPair(PairEvent::kResume);
    BATON_LOG(INFO, kLog) << "resume: the drain is called off; engine " << p->id
                          << " serves again and a standby is launched";
  } else if (s == PairState::kStopped) {
    s_.StepPair(PairEvent::kResume);
    BATON_LOG(INFO, kLog) << "resume: the stopped pair is started again";
  } else {
    return FailedPrecondition("nothing to resume: the pair is " + std::string(ToString(s)) +
                              " (resume undoes batonctl drain)");
  }
  SaveRoster();
  PublishRoutes();
  MaybeLaunch();
  return OkStatus();
}

Status Coordinator::Drill(DrillKind kind) {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  if (upgrade_.has_value()) {
    return FailedPrecondition("an upgrade is in progress; drill once it has ended");
  }
  if (recovery_.has_value()) {
    return FailedPrecondition("the controller is re-adopting its engines; drill once it is done");
  }
  EngineRecord* p = s_.Find(s_.primary);
  if (p == nullptr || !p->serving()) {
    return FailedPrecondition(std::string("no serving primary to drill (pair is ") +
                              ToString(s_.pair.state()) + ")");
  }
  BATON_ASSIGN_OR_RETURN(std::string how, s_.effects.Drill(p->id, kind));
  s_.drill = DrillRecord{kind, p->id, s_.clock.Now()};
  static constexpr const char* kDrills[] = {"kill", "hang", "error"};
  BATON_LOG(INFO, kLog) << "drill " << kDrills[static_cast<int>(kind)] << " on engine " << p->id
                        << " (pid " << p->pid << ")" << how;
  return OkStatus();
}

// --- periodic checks ----------------------------------------------------------------------------

void Coordinator::PollEngines() {
  const TimePoint now = s_.clock.Now();
  struct Failure {
    EngineId id;
    FailCause cause;
    std::string detail;
  };
  std::vector<Failure> failures;
  std::vector<EngineId> probes;
  for (auto& [id, e] : s_.engines) {
    if (!e->live()) continue;
    if (e->deadline.has_value() && now >= *e->deadline) {
      if (e->is(EngineState::kLaunching) || e->is(EngineState::kRegistering)) {
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
        probes.push_back(id);
        break;
      case FailureDetector::Action::kProbeAgain:
        ++e->probes;
        BATON_LOG(WARN, kLog) << "engine " << id << ": the hang verdict came late (the controller "
                              << "stalled), health request sent again";
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
  for (const Failure& f : failures) Fail(f.id, f.cause, f.detail);
}

void Coordinator::PublishRoutes() {
  if (recovery_.has_value() && s_.primary == kNoEngine) {
    return;  // the routers keep the previous controller's table until its primary is back
  }
  proto::RouteTable table;
  table.pair_state = ToString(s_.pair.state());
  for (const auto& [id, e] : s_.engines) {
    if (!e->live() || !e->registered()) continue;
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
    } else if (IsCanary(id)) {
      entry.role = e->is(EngineState::kPromoting) ? proto::EngineRole::kPromoting
                   : e->serving()                 ? proto::EngineRole::kCanary
                                                  : proto::EngineRole::kDraining;
      entry.weight = e->serving() && upgrade_->judge.has_value() ? upgrade_->judge->weight() : 0;
    } else {
      continue;
    }
    table.entries.push_back(std::move(entry));
  }
  for (proto::RouteEntry& entry : table.entries) {  // the primary serves what the canary does not
    if (entry.engine_id != s_.primary || !upgrade_.has_value()) continue;
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

// --- epochs -------------------------------------------------------------------------------------

// Keeps a batch of epochs durable ahead of the next promotion, at a moment when no failover
// is in flight; a journal that cannot be written is logged once until it can again.
void Coordinator::ReplenishEpochs() {
  if (failover_.has_value() || s_.promoting != kNoEngine || !barrier_waits_.empty()) return;
  if (s_.clock.Now() < next_replenish_) return;
  Status s = s_.epochs.Replenish();
  s_.NoteJournalState();
  if (!s.ok()) {
    next_replenish_ = s_.clock.Now() + std::chrono::seconds(5);  // each try spends a batch
    if (!replenish_failing_) {
      BATON_LOG(ERROR, kLog) << "cannot reserve epochs ahead (promotions will write the journal "
                                "themselves): "
                             << s.ToString();
    }
    replenish_failing_ = true;
    return;
  }
  replenish_failing_ = false;
}

// --- the CUDA backend's device ------------------------------------------------------------------

// Every gpu.probe_interval_ms: a lost device (a GPU reset, an uncorrectable error: the
// controller's own context fails) fences every engine, whose imports are of lost memory,
// and the device memory is made again from the pinned cache before engines start again.
void Coordinator::CheckDevice() {
  if (!s_.cuda_backend || s_.config.gpu_probe_interval == Duration::zero()) return;
  const TimePoint now = s_.clock.Now();
  if (now < next_device_probe_) return;
  next_device_probe_ = now + s_.config.gpu_probe_interval;
  if (!s_.effects.DeviceMemoryPresent()) return RebuildDevice();
  Status probe = s_.effects.ProbeDevice();
  if (probe.ok()) return;
  device_lost_reason_ = probe.message();
  ++device_losses_;
  BATON_LOG(ERROR, kLog) << "device lost: " << device_lost_reason_
                         << "; fencing every engine and rebuilding the device memory";
  std::vector<EngineId> ids;
  for (const auto& [id, e] : s_.engines) {
    if (e->live()) ids.push_back(id);
  }
  // The standby first, so that the primary's blocks are not handed to an engine that is
  // about to be fenced too.
  std::stable_partition(ids.begin(), ids.end(), [this](EngineId id) { return id != s_.primary; });
  for (EngineId id : ids) Fail(id, FailCause::kError, "device lost: " + device_lost_reason_);
  s_.effects.DropDevice();
  RebuildDevice();
}

void Coordinator::RebuildDevice() {
  Status rebuilt = s_.effects.RebuildDevice();
  if (!rebuilt.ok()) {
    // A rebuild pins the arena and copies the weights on this thread: retried with an
    // exponential backoff (the probe interval doubled per failure, up to a minute), logged
    // when the reason changes.
    ++rebuild_failures_;
    const Duration wait = std::min<Duration>(
        s_.config.gpu_probe_interval * (int64_t{1} << std::min<uint64_t>(rebuild_failures_, 10)),
        std::chrono::minutes(1));
    next_device_probe_ = s_.clock.Now() + wait;
    if (rebuilt.message() != rebuild_error_) {
      rebuild_error_ = rebuilt.message();
      BATON_LOG(WARN, kLog) << "device memory not rebuilt yet (retried with backoff, next in "
                            << std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()
                            << " ms): " << rebuild_error_;
    }
    return;
  }
  rebuild_error_.clear();
  rebuild_failures_ = 0;
  ++device_rebuilds_;
  MaybeLaunch();
}

}  // namespace baton
