// CoordinatorState: what every part of the Coordinator reads and changes: the pair and engine
// state machines, the engine records, the pool ledger, the epoch store, the promotion
// timelines and the counters `batonctl status` shows, with the lookups and the few steps
// every part takes on them (a machine transition, an epoch made durable, a refusal recorded).
// One per Coordinator, passed by reference to each part (coordinator_parts.h); a part keeps
// what only it needs in a struct of its own.
//
// Also here: what the daemon found at start (StartState), read by the Coordinator's parts.
//
// Ownership: the Coordinator owns it; the config, clock, epoch store and effects are
// borrowed and outlive it. Thread: the Coordinator's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "controller/core/command_record.h"
#include "controller/core/coordinator_config.h"
#include "controller/core/coordinator_mutation.h"
#include "controller/core/coordinator_status.h"
#include "controller/core/crash_loop_guard.h"
#include "controller/core/effects.h"
#include "controller/core/engine_record.h"
#include "controller/core/epoch_store.h"
#include "controller/core/pair_state.h"
#include "controller/core/pool_ledger.h"
#include "controller/core/promotion.h"
#include "controller/core/roster.h"

namespace baton {

// Checks what an engine says of itself (Register, Reattach): bounded UTF-8 and a HOST:PORT
// address; `message` names it in the error.
Status CheckEngineFields(const std::string& version, const std::string& address,
                         const char* message);

// What the daemon found when it started.
struct StartState {
  uint64_t incarnation = 1;  // this controller's number on its state directory
  TimePoint exec_at{};       // when the process started (readopt_ms counts from it)
  // The previous controller's roster (nullopt: none, or refused: `roster_refused` says why).
  std::optional<Roster> roster;
  std::string roster_refused;
  // Per roster engine: whether its process is alive and is the one listed (pid, start time).
  std::map<EngineId, bool> alive;
  // Whether the weight arena and the pool are the previous controller's (kept by
  // baton-keeper and proven complete); why not otherwise. Engines that map other memory than
  // this controller's cannot be re-adopted.
  bool memory_adopted = false;
  std::string memory_reason;
  // What the engines map: the st_dev and st_ino of the arena and pool memfds.
  uint64_t arena_dev = 0, arena_ino = 0, pool_dev = 0, pool_ino = 0;
  // Started without a roster: the processes that still held the kept memory, killed before it
  // was adopted (Controller::ClearHoldersOfKeptMemory).
  std::vector<int> holders_killed;
  std::optional<CommandRecord> commands;
  std::string commands_error;     // a record that did not load, for the log
  uint32_t blocks_per_chunk = 1;  // the device pool's chunk, in blocks (1: host backend)
  bool cuda_backend = false;
};

// The Reclaim sent to the primary and not answered yet (a canary's step, or the promotion
// reserve's refill).
struct PendingReclaim {
  EngineId from = kNoEngine;
  uint32_t blocks = 0;
  TimePoint sent{};
  bool for_reserve = false;  // the reserve's, not a canary's
};

// A drill (batonctl drill) injected into the primary, for its failover's timeline.
struct DrillRecord {
  DrillKind kind;
  EngineId engine = kNoEngine;
  TimePoint at;
};

struct CoordinatorState {
  CoordinatorState(const CoordinatorConfig& config, const Clock& clock, EpochStore& epochs,
                   Effects& effects);

  // A Reclaim the primary has not answered in this long is asked again (the first one still
  // counts against what the primary keeps).
  static constexpr Duration kReclaimAnswerTimeout = std::chrono::seconds(30);

  // --- the machines and lookups -------------------------------------------------------------
  // Applies `event`; a transition the table refuses is a bug, logged and counted.
  template <typename Machine, typename Event>
  void Step(Machine& machine, Event event);
  void StepPair(PairEvent event) { Step(pair, event); }
  // Applies `event` only when the table has a row for it (events that may not apply).
  void StepPairIfAllowed(PairEvent event);
  EngineRecord* Find(EngineId id);
  const EngineRecord* Find(EngineId id) const;
  EngineRecord& Get(EngineId id);  // must exist
  EngineRecord* Standby();         // a live, ready standby, the lowest id first
  size_t LiveEngines() const;
  bool backoff() const;
  // `blocks` rounded up to whole chunks of the pool.
  uint32_t WholeChunks(uint32_t blocks) const;

  // --- records --------------------------------------------------------------------------------
  void Refused(const std::string& who, const std::string& reason);
  void RecordExit(const EngineRecord& e, const std::string& cause, const std::string& exit);
  // Drops engine `id`'s record; its last changes of state are kept in departed_history.
  void Forget(EngineId id);
  // The ledger's invariants; the first violation is kept for status.
  void CheckInvariants();

  // --- epochs ---------------------------------------------------------------------------------
  Result<uint64_t> AdvanceEpoch();
  void NoteJournalState();

  const CoordinatorConfig& config;
  const Clock& clock;
  EpochStore& epochs;
  Effects& effects;

  std::unique_ptr<PoolLedger> ledger;
  PoolLedger::Mutation ledger_mutation = PoolLedger::Mutation::kNone;
  CoordinatorMutation mutation = CoordinatorMutation::kNone;  // tests only
  PairMachine pair;
  CrashLoopGuard guard;
  TimelineLog timelines;
  std::map<EngineId, std::unique_ptr<EngineRecord>> engines;
  EngineId next_engine_id = 1;
  EngineId primary = kNoEngine;    // serving or draining
  EngineId promoting = kNoEngine;  // Promote sent, no PromoteAck yet
  PendingReclaim reclaim;
  std::optional<DrillRecord> drill;
  bool cuda_backend = false;
  bool stopping = false;
  uint64_t incarnation = 1;
  TimePoint relaunch_not_before{};  // the replacement standby, not before

  std::deque<Refusal> refusals;
  std::deque<EngineExit> exits;
  // The changes of state of engines whose records are gone, oldest first (the last 32).
  std::deque<std::pair<EngineId, EngineMachine::Record>> departed_history;
  Status invariants = OkStatus();  // OK, or the first violation of the ledger's invariants
  uint64_t launches = 0;
  uint64_t failovers = 0;
  uint64_t compute_stalls = 0;  // engines fenced for a compute that stood still (ProgressWatch)
  uint64_t called_off_switchovers = 0;
  uint64_t ticks = 0;
  uint64_t refusal_count = 0;
  // Refusals are logged at most kRefusalLinesPerSecond a second (a flood of bad connections
  // would otherwise write a line each); the next line logged says how many were not.
  static constexpr int kRefusalLinesPerSecond = 10;
  TimePoint refusal_second{};
  int refusal_lines = 0;
  uint64_t refusals_unlogged = 0;
  uint64_t refused_transitions = 0;
  bool journal_failing = false;
};

}  // namespace baton
