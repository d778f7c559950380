#include "controller/core/pair_state.h"

namespace baton {
namespace {

using ES = EngineState;
using EE = EngineEvent;
using PS = PairState;
using PE = PairEvent;

// clang-format off
constexpr Transition<ES, EE> kEngineTable[] = {
    {ES::kLaunching, EE::kRegisterAccepted, ES::kRegistering},
    {ES::kLaunching, EE::kDied,           ES::kFencing},
    {ES::kLaunching, EE::kHungConfirmed,  ES::kFencing},
    {ES::kLaunching, EE::kErrorReported,  ES::kFencing},
    {ES::kLaunching, EE::kFenceStarted,   ES::kFencing},

    {ES::kRegistering, EE::kRegistered,    ES::kStandby},
    {ES::kRegistering, EE::kDied,          ES::kFencing},
    {ES::kRegistering, EE::kHungConfirmed, ES::kFencing},
    {ES::kRegistering, EE::kErrorReported, ES::kFencing},
    {ES::kRegistering, EE::kFenceStarted,  ES::kFencing},

    {ES::kAdopting,  EE::kRegisterAccepted,   ES::kRegistering},
    {ES::kAdopting,  EE::kReadoptedStandby,   ES::kStandby},
    {ES::kAdopting,  EE::kReadoptedPromoting, ES::kPromoting},
    {ES::kAdopting,  EE::kReadoptedServing,   ES::kPrimary},
    {ES::kAdopting,  EE::kReadoptedDraining,  ES::kDraining},
    {ES::kAdopting,  EE::kDied,               ES::kFencing},
    {ES::kAdopting,  EE::kHungConfirmed,      ES::kFencing},
    {ES::kAdopting,  EE::kErrorReported,      ES::kFencing},
    {ES::kAdopting,  EE::kFenceStarted,       ES::kFencing},

    {ES::kStandby,   EE::kPromoteStarted, ES::kPromoting},
    {ES::kStandby,   EE::kDied,           ES::kFencing},
    {ES::kStandby,   EE::kHungConfirmed,  ES::kFencing},
    {ES::kStandby,   EE::kErrorReported,  ES::kFencing},
    {ES::kStandby,   EE::kFenceStarted,   ES::kFencing},

    {ES::kPromoting, EE::kPromoteDone,    ES::kPrimary},
    {ES::kPromoting, EE::kDied,           ES::kFencing},
    {ES::kPromoting, EE::kHungConfirmed,  ES::kFencing},
    {ES::kPromoting, EE::kErrorReported,  ES::kFencing},
    {ES::kPromoting, EE::kFenceStarted,   ES::kFencing},

    {ES::kPrimary,   EE::kDrain,          ES::kDraining},
    {ES::kPrimary,   EE::kDied,           ES::kFencing},
    {ES::kPrimary,   EE::kHungConfirmed,  ES::kFencing},
    {ES::kPrimary,   EE::kErrorReported,  ES::kFencing},
    {ES::kPrimary,   EE::kFenceStarted,   ES::kFencing},

    {ES::kDraining,  EE::kDrainCancelled, ES::kPrimary},
    {ES::kDraining,  EE::kDrained,        ES::kFencing},
    {ES::kDraining,  EE::kDied,           ES::kFencing},
    {ES::kDraining,  EE::kHungConfirmed,  ES::kFencing},
    {ES::kDraining,  EE::kErrorReported,  ES::kFencing},
    {ES::kDraining,  EE::kFenceStarted,   ES::kFencing},

    // A fenced engine may still die (the SIGKILL lands) or report late; nothing changes.
    {ES::kFencing,   EE::kDied,           ES::kFencing},
    {ES::kFencing,   EE::kErrorReported,  ES::kFencing},
    {ES::kFencing,   EE::kFenceDone,      ES::kDead},
};

constexpr Transition<PS, PE> kPairTable[] = {
    {PS::kStarting,        PE::kStandbyReady,             PS::kStarting},
    {PS::kStarting,        PE::kStandbyDied,              PS::kStarting},
    {PS::kStarting,        PE::kPromoteDone,              PS::kDegraded},
    {PS::kStarting,        PE::kFenceDone,                PS::kStarting},
    {PS::kStarting,        PE::kCrashLoopTripped,         PS::kDownBackoff},
    {PS::kStarting,        PE::kDrain,                    PS::kStopped},

    {PS::kReady,           PE::kStandbyDied,              PS::kDegraded},
    {PS::kReady,           PE::kPrimaryDied,              PS::kFailingOver},
    {PS::kReady,           PE::kPrimaryHung,              PS::kFailingOver},
    {PS::kReady,           PE::kErrorReported,            PS::kFailingOver},
    {PS::kReady,           PE::kGracefulPromoteRequested, PS::kSwitchingOver},
    {PS::kReady,           PE::kFenceDone,                PS::kReady},
    {PS::kReady,           PE::kDrain,                    PS::kDraining},

    {PS::kDegraded,        PE::kStandbyReady,             PS::kReady},
    {PS::kDegraded,        PE::kStandbyDied,              PS::kDegraded},
    {PS::kDegraded,        PE::kPrimaryDied,              PS::kDown},
    {PS::kDegraded,        PE::kPrimaryHung,              PS::kDown},
    {PS::kDegraded,        PE::kErrorReported,            PS::kDown},
    {PS::kDegraded,        PE::kFenceDone,                PS::kDegraded},
    {PS::kDegraded,        PE::kCrashLoopTripped,         PS::kDegradedBackoff},
    {PS::kDegraded,        PE::kDrain,                    PS::kDraining},

    {PS::kFailingOver,     PE::kPromoteDone,              PS::kDegraded},
    {PS::kFailingOver,     PE::kStandbyDied,              PS::kDown},
    {PS::kFailingOver,     PE::kFenceDone,                PS::kFailingOver},

    // The old primary drains; once drained it is fenced and the promotion proceeds as in
    // a failover. If it fails while draining, that is a failover.
    {PS::kSwitchingOver,   PE::kDrained,                  PS::kFailingOver},
    {PS::kSwitchingOver,   PE::kPromoteDone,              PS::kDegraded},
    {PS::kSwitchingOver,   PE::kStandbyDied,              PS::kDegraded},
    {PS::kSwitchingOver,   PE::kPrimaryDied,              PS::kFailingOver},
    {PS::kSwitchingOver,   PE::kPrimaryHung,              PS::kFailingOver},
    {PS::kSwitchingOver,   PE::kErrorReported,            PS::kFailingOver},
    {PS::kSwitchingOver,   PE::kFenceDone,                PS::kSwitchingOver},

    {PS::kDown,            PE::kStandbyReady,             PS::kDown},
    {PS::kDown,            PE::kStandbyDied,              PS::kDown},
    {PS::kDown,            PE::kPromoteDone,              PS::kDegraded},
    {PS::kDown,            PE::kFenceDone,                PS::kDown},
    {PS::kDown,            PE::kCrashLoopTripped,         PS::kDownBackoff},
    {PS::kDown,            PE::kDrain,                    PS::kStopped},

    {PS::kDegradedBackoff, PE::kBackoffElapsed,           PS::kDegraded},
    {PS::kDegradedBackoff, PE::kStandbyReady,             PS::kReady},
    {PS::kDegradedBackoff, PE::kStandbyDied,              PS::kDegradedBackoff},
    {PS::kDegradedBackoff, PE::kPrimaryDied,              PS::kDownBackoff},
    {PS::kDegradedBackoff, PE::kPrimaryHung,              PS::kDownBackoff},
    {PS::kDegradedBackoff, PE::kErrorReported,            PS::kDownBackoff},
    {PS::kDegradedBackoff, PE::kFenceDone,                PS::kDegradedBackoff},
    {PS::kDegradedBackoff, PE::kCrashLoopTripped,         PS::kDegradedBackoff},
    {PS::kDegradedBackoff, PE::kDrain,                    PS::kDraining},

    {PS::kDownBackoff,     PE::kBackoffElapsed,           PS::kDown},
    {PS::kDownBackoff,     PE::kStandbyReady,             PS::kDownBackoff},
    {PS::kDownBackoff,     PE::kStandbyDied,              PS::kDownBackoff},
    {PS::kDownBackoff,     PE::kPromoteDone,              PS::kDegradedBackoff},
    {PS::kDownBackoff,     PE::kFenceDone,                PS::kDownBackoff},
    {PS::kDownBackoff,     PE::kCrashLoopTripped,         PS::kDownBackoff},
    {PS::kDownBackoff,     PE::kDrain,                    PS::kStopped},

    {PS::kDraining,        PE::kDrained,                  PS::kStopped},
    {PS::kDraining,        PE::kStandbyReady,             PS::kDraining},
    {PS::kDraining,        PE::kStandbyDied,              PS::kDraining},
    {PS::kDraining,        PE::kPrimaryDied,              PS::kStopped},
    {PS::kDraining,        PE::kPrimaryHung,              PS::kStopped},
    {PS::kDraining,        PE::kErrorReported,            PS::kStopped},
    {PS::kDraining,        PE::kFenceDone,                PS::kDraining},

    {PS::kStopped,         PE::kStandbyReady,             PS::kStopped},
    {PS::kStopped,         PE::kStandbyDied,              PS::kStopped},
    {PS::kStopped,         PE::kPrimaryDied,              PS::kStopped},
    {PS::kStopped,         PE::kPrimaryHung,              PS::kStopped},
    {PS::kStopped,         PE::kErrorReported,            PS::kStopped},
    {PS::kStopped,         PE::kFenceDone,                PS::kStopped},

    // `batonctl resume`: the draining primary serves again (a standby is launched), or a
    // stopped pair starts afresh (the first engine to register is promoted).
    {PS::kDraining,        PE::kResume,                   PS::kDegraded},
    {PS::kStopped,         PE::kResume,                   PS::kDown},

    // A restarted controller: the previous one's engines register again or are fenced.
    {PS::kRecovering,      PE::kStandbyReady,             PS::kRecovering},
    {PS::kRecovering,      PE::kStandbyDied,              PS::kRecovering},
    {PS::kRecovering,      PE::kPromoteDone,              PS::kDegraded},
    {PS::kRecovering,      PE::kPrimaryDied,              PS::kFailingOver},
    {PS::kRecovering,      PE::kPrimaryHung,              PS::kFailingOver},
    {PS::kRecovering,      PE::kErrorReported,            PS::kFailingOver},
    {PS::kRecovering,      PE::kFenceDone,                PS::kRecovering},
    {PS::kRecovering,      PE::kRecoveryDone,             PS::kStarting},
    // The previous controller's draining primary is gone: `batonctl drain` outlives it.
    {PS::kRecovering,      PE::kDrained,                  PS::kStopped},
    {PS::kRecovering,      PE::kCrashLoopTripped,         PS::kDownBackoff},
    // A primary re-adopted while another engine is still awaited, or a failover that ends
    // while it is: recovery ending changes nothing more.
    {PS::kDegraded,        PE::kRecoveryDone,             PS::kDegraded},
    {PS::kReady,           PE::kRecoveryDone,             PS::kReady},
    {PS::kFailingOver,     PE::kRecoveryDone,             PS::kFailingOver},
    {PS::kDown,            PE::kRecoveryDone,             PS::kDown},
    {PS::kDegradedBackoff, PE::kRecoveryDone,             PS::kDegradedBackoff},
    {PS::kDownBackoff,     PE::kRecoveryDone,             PS::kDownBackoff},
    {PS::kDraining,        PE::kRecoveryDone,             PS::kDraining},
    {PS::kStopped,         PE::kRecoveryDone,             PS::kStopped},
    {PS::kSwitchingOver,   PE::kRecoveryDone,             PS::kSwitchingOver},
};
// clang-format on

}  // namespace

const char* ToString(EngineState state) {
  switch (state) {
    case ES::kLaunching:
      return "launching";
    case ES::kRegistering:
      return "registering";
    case ES::kAdopting:
      return "adopting";
    case ES::kStandby:
      return "standby";
    case ES::kPromoting:
      return "promoting";
    case ES::kPrimary:
      return "primary";
    case ES::kDraining:
      return "draining";
    case ES::kFencing:
      return "fencing";
    case ES::kDead:
      return "dead";
  }
  return "unknown";
}

const char* ToString(EngineEvent event) {
  switch (event) {
    case EE::kRegisterAccepted:
      return "register_accepted";
    case EE::kRegistered:
      return "registered";
    case EE::kReadoptedStandby:
      return "readopted_standby";
    case EE::kReadoptedPromoting:
      return "readopted_promoting";
    case EE::kReadoptedServing:
      return "readopted_serving";
    case EE::kReadoptedDraining:
      return "readopted_draining";
    case EE::kPromoteStarted:
      return "promote_started";
    case EE::kPromoteDone:
      return "promote_done";
    case EE::kDrain:
      return "drain";
    case EE::kDrainCancelled:
      return "drain_cancelled";
    case EE::kDrained:
      return "drained";
    case EE::kDied:
      return "died";
    case EE::kHungConfirmed:
      return "hung_confirmed";
    case EE::kErrorReported:
      return "error_reported";
    case EE::kFenceStarted:
      return "fence_started";
    case EE::kFenceDone:
      return "fence_done";
  }
  return "unknown";
}

const char* ToString(PairState state) {
  switch (state) {
    case PS::kStarting:
      return "starting";
    case PS::kReady:
      return "ready";
    case PS::kDegraded:
      return "degraded";
    case PS::kFailingOver:
      return "failing_over";
    case PS::kSwitchingOver:
      return "switching_over";
    case PS::kDown:
      return "down";
    case PS::kDegradedBackoff:
      return "degraded_backoff";
    case PS::kDownBackoff:
      return "down_backoff";
    case PS::kDraining:
      return "draining";
    case PS::kStopped:
      return "stopped";
    case PS::kRecovering:
      return "recovering";
  }
  return "unknown";
}

const char* ToString(PairEvent event) {
  switch (event) {
    case PE::kStandbyReady:
      return "standby_ready";
    case PE::kStandbyDied:
      return "standby_died";
    case PE::kPrimaryDied:
      return "primary_died";
    case PE::kPrimaryHung:
      return "primary_hung";
    case PE::kErrorReported:
      return "error_reported";
    case PE::kFenceDone:
      return "fence_done";
    case PE::kPromoteDone:
      return "promote_done";
    case PE::kGracefulPromoteRequested:
      return "graceful_promote_requested";
    case PE::kDrain:
      return "drain";
    case PE::kDrained:
      return "drained";
    case PE::kCrashLoopTripped:
      return "crash_loop_tripped";
    case PE::kBackoffElapsed:
      return "backoff_elapsed";
    case PE::kResume:
      return "resume";
    case PE::kRecoveryDone:
      return "recovery_done";
  }
  return "unknown";
}

std::span<const Transition<EngineState, EngineEvent>> EngineTable() { return kEngineTable; }
std::span<const Transition<PairState, PairEvent>> PairTable() { return kPairTable; }

EngineMachine NewEngineMachine(uint64_t engine_id, const Clock& clock) {
  return EngineMachine("engine " + std::to_string(engine_id), EngineTable(),
                       EngineState::kLaunching, clock);
}

PairMachine NewPairMachine(std::string name, const Clock& clock, bool recovering) {
  return PairMachine(std::move(name), PairTable(),
                     recovering ? PairState::kRecovering : PairState::kStarting, clock);
}

EngineMachine AdoptedEngineMachine(uint64_t engine_id, const Clock& clock) {
  return EngineMachine("engine " + std::to_string(engine_id), EngineTable(), EngineState::kAdopting,
                       clock);
}

bool PairServes(PairState state) {
  switch (state) {
    case PS::kReady:
    case PS::kDegraded:
    case PS::kSwitchingOver:
    case PS::kDegradedBackoff:
    case PS::kDraining:
      return true;
    default:
      return false;
  }
}

}  // namespace baton
