// Engine and pair state machines: one explicit transition table each.
//
// StateMachine<S, E> applies events against a fixed table of {from, event, to} rows. An
// event with no row for the current state is refused with a reason naming the machine, the
// state and the event; the state does not change. Every applied transition (self-loops too)
// is kept, with its time from the injected Clock, in a bounded history for `batonctl status`.
//
// Engine states follow one engine process from launch to death:
//   launching -> registering -> standby -> promoting -> primary -> draining -> fencing -> dead
// An engine a previous controller launched starts in adopting (its process found alive, not
// registered again yet) and goes to the state it reports, or to fencing.
// Pair states describe what the service can do:
//   starting, ready (primary + standby), degraded (primary, no standby),
//   failing_over (primary lost, standby being promoted), switching_over (planned promotion),
//   down (no primary, no standby to promote), degraded_backoff / down_backoff (the crash-loop
//   guard holds restarts back), draining, stopped, and recovering (a restarted controller
//   waits for a previous controller's engines to register again).
//
// Ownership: the controller owns one PairMachine per pair and one EngineMachine per engine;
// the Clock must outlive them. Thread: io_context thread only.
#pragma once

#include <cstddef>
#include <deque>
#include <span>
#include <string>

#include "base/clock.h"
#include "base/log.h"
#include "base/status.h"

namespace baton {

enum class EngineState {
  kLaunching,
  kRegistering,  // Register accepted; mapping the weights, reserving the pool range
  kAdopting,     // launched by a previous controller; not registered with this one yet
  kStandby,
  kPromoting,
  kPrimary,
  kDraining,
  kFencing,
  kDead,
};

enum class EngineEvent {
  kRegisterAccepted,    // Register checked and answered (RegisterAck sent)
  kRegistered,          // StandbyReady: weights mapped, pool range reserved
  kReadoptedStandby,    // a previous controller's engine reattached as a standby
  kReadoptedPromoting,  // ... promoted, not serving yet
  kReadoptedServing,    // ... serving
  kReadoptedDraining,   // ... draining
  kPromoteStarted,      // the controller began promoting it
  kPromoteDone,         // it serves as primary
  kDrain,               // stop taking new requests (planned switch-over)
  kDrainCancelled,      // the switch-over was abandoned; serve again
  kDrained,             // in-flight requests finished
  kDied,                // the process exited (pidfd) or its socket closed
  kHungConfirmed,       // missed heartbeats and no answer to the health request
  kErrorReported,       // the SDK reported an async device error
  kFenceStarted,        // the controller revokes it (planned, stale after restart, misbehaving)
  kFenceDone,           // reaped; its blocks wait behind the barrier (coordinator_barrier.cc)
};

enum class PairState {
  kStarting,
  kReady,
  kDegraded,
  kFailingOver,
  kSwitchingOver,
  kDown,
  kDegradedBackoff,
  kDownBackoff,
  kDraining,
  kStopped,
  kRecovering,
};

enum class PairEvent {
  kStandbyReady,  // the non-primary engine registered
  kStandbyDied,   // the non-primary engine (launching, standby, promoting) was lost
  kPrimaryDied,
  kPrimaryHung,               // confirmed by a health request
  kErrorReported,             // by the primary's SDK
  kFenceDone,                 // an old engine is reaped (its blocks follow past the barrier)
  kPromoteDone,               // an engine now serves as primary
  kGracefulPromoteRequested,  // `batonctl promote`
  kDrain,                     // `batonctl drain`
  kDrained,
  kCrashLoopTripped,  // a restart is due but the crash-loop guard holds it back
  kBackoffElapsed,
  kRecoveryDone,  // every previous controller's engine is re-adopted or fenced
  kResume,        // `batonctl resume`: a drain called off, or a stopped pair started again
};

const char* ToString(EngineState state);
const char* ToString(EngineEvent event);
const char* ToString(PairState state);
const char* ToString(PairEvent event);

template <typename S, typename E>
struct Transition {
  S from;
  E event;
  S to;
};

template <typename S, typename E>
struct TransitionRecord {
  TimePoint at;
  S from;
  E event;
  S to;
};

template <typename S, typename E>
class StateMachine {
 public:
  using Table = std::span<const Transition<S, E>>;
  using Record = TransitionRecord<S, E>;

  StateMachine(std::string name, Table table, S initial, const Clock& clock,
               size_t history_limit = 32)
      : name_(std::move(name)),
        table_(table),
        state_(initial),
        clock_(&clock),
        history_limit_(history_limit) {}

  S state() const { return state_; }
  // The name its log lines begin with ("engine 4", "engine 4 (canary)").
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  // The changes of state, oldest first; at most history_limit entries. An event that leaves
  // the state as it was is neither recorded nor logged.
  const std::deque<Record>& history() const { return history_; }

  // True if `event` has a row for the current state.
  bool Allows(E event) const { return Find(event) != nullptr; }

  // Applies `event`; returns the new state, or FailedPrecondition naming why it was refused.
  Result<S> Apply(E event) {
    const Transition<S, E>* row = Find(event);
    if (row == nullptr) {
      std::string reason =
          name_ + ": " + ToString(event) + " is not allowed in state " + ToString(state_);
      BATON_LOG(WARN, "state") << "refused " << reason;
      return FailedPrecondition(std::move(reason));
    }
    if (row->to != state_) {
      history_.push_back(Record{clock_->Now(), state_, event, row->to});
      if (history_.size() > history_limit_) history_.pop_front();
      BATON_LOG(INFO, "state") << name_ << ": " << ToString(state_) << " -> " << ToString(row->to)
                               << " on " << ToString(event);
    }
    state_ = row->to;
    return state_;
  }

 private:
  const Transition<S, E>* Find(E event) const {
    for (const auto& row : table_) {
      if (row.from == state_ && row.event == event) return &row;
    }
    return nullptr;
  }

  std::string name_;
  Table table_;
  S state_;
  const Clock* clock_;
  size_t history_limit_;
  std::deque<Record> history_;
};

using EngineMachine = StateMachine<EngineState, EngineEvent>;
using PairMachine = StateMachine<PairState, PairEvent>;

// The transition tables (static storage).
std::span<const Transition<EngineState, EngineEvent>> EngineTable();
std::span<const Transition<PairState, PairEvent>> PairTable();

// An engine machine in kLaunching, named "engine <id>".
EngineMachine NewEngineMachine(uint64_t engine_id, const Clock& clock);
// A pair machine in kStarting (kRecovering when `recovering`).
PairMachine NewPairMachine(std::string name, const Clock& clock, bool recovering = false);
// An engine machine in kAdopting, named "engine <id>".
EngineMachine AdoptedEngineMachine(uint64_t engine_id, const Clock& clock);

// True for the pair states in which a primary serves traffic.
bool PairServes(PairState state);

}  // namespace baton
