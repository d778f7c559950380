// CommandPart: the operator's commands on the pair (coordinator_commands.h).
#include "base/failpoint.h"
#include "base/log.h"
#include "controller/core/coordinator_parts.h"

namespace baton {

namespace {

constexpr const char* kLog = "controller";

uint32_t Millis(Duration d) {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

}  // namespace

CommandPart::CommandPart(CoordinatorState& s, const CoordinatorParts& p) : s_(s), p_(p) {}

Status CommandPart::RequestSwitchover() {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  EngineRecord* p = s_.Find(s_.primary);
  EngineRecord* s = s_.Standby();
  const std::string pair = ToString(s_.pair.state());
  if (p == nullptr || !p->serving()) {
    return FailedPrecondition("no serving primary to switch over from (pair is " + pair + ")");
  }
  if (p_.upgrades->active()) {
    return FailedPrecondition("an upgrade is in progress; `batonctl rollback` ends it");
  }
  if (s == nullptr) return FailedPrecondition("no ready standby to promote (pair is " + pair + ")");
  BATON_RETURN_IF_ERROR(CheckNoCalledOffDrain(*p));
  Result<PairState> applied = s_.pair.Apply(PairEvent::kGracefulPromoteRequested);
  if (!applied.ok()) return applied.status();
  OpenPlannedTimeline(PromotionKind::kSwitchover, "batonctl promote", *p, s->id);
  BATON_LOG(INFO, kLog) << "switch-over: draining engine " << p->id << ", then promoting engine "
                        << s->id;
  DrainEngine(*p, /*successor=*/true);
  BATON_FAILPOINT("mid_switchover");  // the primary told to drain
  p_.engines->PublishRoutes();
  return OkStatus();
}

PromotionRecord& CommandPart::OpenPlannedTimeline(PromotionKind kind, const std::string& cause,
                                                  const EngineRecord& old, EngineId next) {
  PromotionRecord& r = s_.timelines.Open(kind, cause);
  r.requested = s_.clock.Now();  // nothing is injected: the old primary is asked to drain
  r.old_engine = old.id;
  r.old_pid = old.pid;
  r.new_engine = next;
  return r;
}

void CommandPart::DrainEngine(EngineRecord& e, bool successor) {
  s_.Step(e.machine, EngineEvent::kDrain);
  e.deadline = s_.clock.Now() + s_.config.drain_timeout;
  p_.engines->SaveRoster();
  const uint64_t epoch = s_.ledger->engine(e.id)->epoch;
  const uint32_t timeout_ms = Millis(s_.config.drain_timeout);
  if (!successor && e.protocol >= proto::kProtocolVersionFinalDrain) {
    p_.engines->SendOrFail(e, proto::FinalDrain{.epoch = epoch, .timeout_ms = timeout_ms});
    return;
  }
  if (!successor) {
    BATON_LOG(WARN, kLog) << "engine " << e.id << " speaks protocol " << e.protocol
                          << ", which has no drain without a next primary: it may hand its "
                             "requests over to one that never comes (the router fails them)";
  }
  p_.engines->SendOrFail(e, proto::Drain{.epoch = epoch, .timeout_ms = timeout_ms});
}

bool CommandPart::ResumeEngine(EngineRecord& e) {
  if (!e.is(EngineState::kDraining) || !e.connected || e.protocol < proto::kProtocolVersionResume) {
    return false;
  }
  s_.Step(e.machine, EngineEvent::kDrainCancelled);
  e.deadline.reset();
  ++e.called_off_drains;
  p_.engines->SaveRoster();
  return p_.engines->SendOrFail(e, proto::Resume{.epoch = s_.ledger->engine(e.id)->epoch});
}

Status CommandPart::CheckNoCalledOffDrain(const EngineRecord& primary) const {
  if (primary.called_off_drains == 0) return OkStatus();
  return Unavailable("engine " + std::to_string(primary.id) +
                     " still finishes the drain that was called off; try again in a moment");
}

void CommandPart::CallOffSwitchover(EngineRecord& standby) {
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

Status CommandPart::RequestDrain() {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  if (p_.upgrades->active()) {
    return FailedPrecondition("an upgrade is in progress; `batonctl rollback` ends it first");
  }
  if (EngineRecord* p = s_.Find(s_.primary); p != nullptr) {
    BATON_RETURN_IF_ERROR(CheckNoCalledOffDrain(*p));
  }
  Result<PairState> applied = s_.pair.Apply(PairEvent::kDrain);
  if (!applied.ok()) return applied.status();
  TakeOutOfService();
  BATON_LOG(INFO, kLog) << "drain: the pair is taken out of service";
  p_.engines->SaveRoster();
  p_.engines->PublishRoutes();
  return OkStatus();
}

void CommandPart::TakeOutOfService() {
  std::vector<EngineId> others;
  for (const auto& [id, e] : s_.engines) {
    if (e->live() && id != s_.primary && s_.mutation != CoordinatorMutation::kDrainSparesStandby)
      others.push_back(id);
  }
  for (EngineId id : others)
    p_.failover->Fence(id, FailCause::kShutdown, "the pair is being drained");
  EngineRecord* p = s_.Find(s_.primary);
  if (p != nullptr && p->live() && !p->is(EngineState::kDraining))
    DrainEngine(*p, /*successor=*/false);
}

void CommandPart::KeepDrained() {
  const PairState state = s_.pair.state();
  const bool out = state == PairState::kDraining || state == PairState::kStopped;
  if (!out && !s_.pair.Allows(PairEvent::kDrain)) {
    BATON_LOG(WARN, kLog) << "the previous controller's pair was drained, but this one's is "
                          << ToString(state) << ": the drain cannot go on";
    return;
  }
  if (!out) s_.StepPair(PairEvent::kDrain);
  TakeOutOfService();  // also an engine re-adopted beside a primary that drains or is gone
  BATON_LOG(INFO, kLog) << "drain: the pair stays out of service (batonctl drain took it out "
                           "before this controller started; batonctl resume starts it)";
  p_.engines->SaveRoster();
  p_.engines->PublishRoutes();
}

Status CommandPart::RequestResume() {
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
  p_.engines->SaveRoster();
  p_.engines->PublishRoutes();
  p_.engines->MaybeLaunch();
  return OkStatus();
}

Status CommandPart::Drill(DrillKind kind) {
  if (s_.stopping) return Unavailable("the controller is shutting down");
  if (p_.upgrades->active()) {
    return FailedPrecondition("an upgrade is in progress; drill once it has ended");
  }
  if (p_.recovery->active()) {
    return FailedPrecondition("the controller is re-adopting its engines; drill once it is done");
  }
  EngineRecord* p = s_.Find(s_.primary);
  if (p == nullptr || !p->serving()) {
    return FailedPrecondition(std::string("no serving primary to drill (pair is ") +
                              ToString(s_.pair.state()) + ")");
  }
  BATON_ASSIGN_OR_RETURN(std::string how, s_.effects.Drill(p->id, kind));
  s_.drill = DrillRecord{kind, p->id, s_.clock.Now()};
  BATON_LOG(INFO, kLog) << "drill " << ToString(kind) << " on engine " << p->id << " (pid "
                        << p->pid << ")" << how;
  return OkStatus();
}

}  // namespace baton
