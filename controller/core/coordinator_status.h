// CoordinatorStatus: one read-only copy of everything the Coordinator knows, for
// `batonctl status`, `batonctl timeline` and /metrics (controller/ctl/). Taken with
// Coordinator::Snapshot(); plain values, no pointers into the Coordinator.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "controller/core/failure_detector.h"
#include "controller/core/pair_state.h"
#include "controller/core/pool_ledger.h"
#include "controller/core/promotion.h"
#include "controller/core/upgrade.h"
#include "proto/roles.h"

namespace baton {

// A message or connection the controller refused.
struct Refusal {
  TimePoint at;
  std::string who;
  std::string reason;
};

// An engine that is gone.
struct EngineExit {
  TimePoint at;
  EngineId id = 0;
  pid_t pid = 0;
  proto::LaunchRole launch_role = proto::LaunchRole::kStandby;
  std::string cause;
  std::string exit;
};

struct EngineStatus {
  EngineId id = kNoEngine;
  proto::EngineRole role = proto::EngineRole::kLaunching;
  EngineState state = EngineState::kLaunching;
  proto::LaunchRole launch_role = proto::LaunchRole::kStandby;
  pid_t pid = 0;
  bool adopted = false;  // launched by a previous controller and re-adopted
  LedgerEngine ledger;   // role kStandby, epoch 0, no blocks when the ledger does not know it
  std::vector<Lease> leases;
  std::string version;
  std::string http_address;
  int port = 0;
  bool serving = false;
  bool registered = false;
  uint64_t heartbeats = 0;
  uint64_t probes = 0;
  TimePoint launched_at{};
  TimePoint last_heartbeat{};
  uint64_t prefault_us = 0;
  std::string device_memory;
  std::optional<FailureDetector::State> detector;
  std::optional<std::string> fence_reason;
  std::vector<std::string> command;
  std::deque<EngineMachine::Record> history;
};

struct UpgradeStatus {
  UpgradeKind kind = UpgradeKind::kUpgrade;
  Upgrade::Phase phase = Upgrade::Phase::kLaunching;
  EngineId primary = kNoEngine;
  EngineId canary = kNoEngine;
  std::vector<std::string> command;
  std::vector<std::string> previous;
  std::vector<uint32_t> steps;
  uint32_t weight = 0;  // the canary's share now (0 before it serves)
  std::optional<size_t> step;
  std::string judgement;
  std::string rollback_reason;
  TimePoint started{};
  TimePoint phase_since{};
  // What the routers saw of each side since the canary started (once it serves).
  std::optional<proto::EngineOutcome> canary_seen;
  std::optional<proto::EngineOutcome> primary_seen;
};

// What a restarted controller found and did with it.
struct RecoveryStatus {
  bool restarted = false;  // a previous controller's roster was found
  bool in_progress = false;
  std::string roster;  // "adopted", "none", or why it was refused
  std::string memory;  // "adopted", or why the weights and pool were made afresh
  std::vector<EngineId> readopted;
  struct Fenced {
    EngineId id = kNoEngine;
    std::string reason;
  };
  std::vector<Fenced> fenced;
  // Engines of the previous controller found exited, or drained to their end, at the start:
  // nothing to account for, so not `fenced`, but not re-adopted either.
  std::vector<Fenced> gone;
  // Started without a roster: pids that held the kept memory, killed before it was adopted.
  std::vector<int> holders_killed;
  std::optional<double> readopt_ms;    // process start to the pair ready again with its engines
  std::optional<std::string> upgrade;  // what became of an upgrade in flight
};

struct CoordinatorStatus {
  TimePoint now{};
  PairState pair_state = PairState::kStarting;
  std::deque<PairMachine::Record> pair_history;
  // Changes of state of engines no longer in `engines` (CoordinatorState::departed_history).
  std::deque<std::pair<EngineId, EngineMachine::Record>> departed_history;
  EngineId primary = kNoEngine;
  std::vector<EngineStatus> engines;
  LedgerSnapshot ledger;
  Status invariants;  // OK, or the first violation of the ledger's invariants
  uint64_t refused_transitions = 0;

  bool guard_in_backoff = false;
  int guard_level = 0;
  int guard_recent_failures = 0;
  uint64_t guard_total_failures = 0;
  TimePoint guard_next_restart_at{};

  std::deque<PromotionRecord> timelines;
  std::deque<Refusal> refusals;
  std::deque<EngineExit> exits;
  uint64_t launches = 0;
  uint64_t failovers = 0;
  uint64_t compute_stalls = 0;  // engines fenced for a compute that stood still
  uint64_t called_off_switchovers = 0;
  uint64_t ticks = 0;
  uint64_t refusal_count = 0;

  std::optional<UpgradeStatus> upgrade;
  std::deque<UpgradeResult> upgrade_history;
  std::vector<std::string> active_command;
  std::vector<std::string> previous_command;
  uint64_t upgrades_promoted = 0;
  uint64_t upgrades_rolled_back = 0;

  std::vector<EngineId> unfenced_reaped;
  size_t barrier_waits = 0;
  // The promotion reserve: its target (0: none), the blocks it holds now, and why there is
  // none ("" when there is one): a failover's promotion starts on it before the barrier.
  uint32_t reserve_target = 0;
  uint32_t reserve_available = 0;
  std::string reserve_note;
  bool journal_failing = false;

  bool cuda_backend = false;
  bool device_memory_present = true;
  uint64_t device_losses = 0;
  uint64_t device_rebuilds = 0;
  std::string device_lost_reason;

  uint64_t incarnation = 1;
  RecoveryStatus recovery;

  // The engine of that id, or nullptr.
  const EngineStatus* Find(EngineId id) const;
};

}  // namespace baton
