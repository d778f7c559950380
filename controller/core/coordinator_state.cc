// CoordinatorState: the lookups and steps every part of the Coordinator takes on its state.
#include "controller/core/coordinator_state.h"

#include <algorithm>
#include <cstdlib>

#include "base/bug.h"
#include "base/check.h"
#include "base/log.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";
constexpr size_t kKeepRefusals = 20;
constexpr size_t kKeepExits = 20;

}  // namespace

CoordinatorState::CoordinatorState(const CoordinatorConfig& config_in, const Clock& clock_in,
                                   EpochStore& epochs_in, Effects& effects_in)
    : config(config_in),
      clock(clock_in),
      epochs(epochs_in),
      effects(effects_in),
      ledger(std::make_unique<PoolLedger>(config_in.block_count, epochs_in)),
      pair(NewPairMachine("pair", clock_in)),
      guard(clock_in, config_in.crash),
      timelines(clock_in) {}

// --- machines and lookups -----------------------------------------------------------------------

template <typename Machine, typename Event>
void CoordinatorState::Step(Machine& machine, Event event) {
  Result<decltype(machine.state())> applied = machine.Apply(event);
  if (applied.ok()) return;
  ++refused_transitions;
  BATON_BUG("state") << "a refused transition: " << applied.status().message();
}

template void CoordinatorState::Step(EngineMachine&, EngineEvent);
template void CoordinatorState::Step(PairMachine&, PairEvent);

void CoordinatorState::StepPairIfAllowed(PairEvent event) {
  if (pair.Allows(event)) StepPair(event);
}

EngineRecord* CoordinatorState::Find(EngineId id) {
  auto it = engines.find(id);
  return it == engines.end() ? nullptr : it->second.get();
}

const EngineRecord* CoordinatorState::Find(EngineId id) const {
  auto it = engines.find(id);
  return it == engines.end() ? nullptr : it->second.get();
}

EngineRecord& CoordinatorState::Get(EngineId id) {
  EngineRecord* e = Find(id);
  BATON_CHECK(e != nullptr) << "engine " << id << " is not known";
  return *e;
}

EngineRecord* CoordinatorState::Standby() {
  for (auto& [id, e] : engines) {
    if (e->live() && e->is(EngineState::kStandby)) return e.get();
  }
  return nullptr;
}

size_t CoordinatorState::LiveEngines() const {
  size_t n = 0;
  for (const auto& [id, e] : engines) n += e->live() ? 1 : 0;
  return n;
}

bool CoordinatorState::backoff() const {
  return pair.state() == PairState::kDegradedBackoff || pair.state() == PairState::kDownBackoff;
}

uint32_t CoordinatorState::WholeChunks(uint32_t blocks) const {
  const uint32_t chunk = ledger->blocks_per_chunk();
  return (blocks + chunk - 1) / chunk * chunk;
}

// --- records ------------------------------------------------------------------------------------

void CoordinatorState::Refused(const std::string& who, const std::string& reason) {
  const TimePoint now = clock.Now();
  if (now - refusal_second >= std::chrono::seconds(1)) {
    refusal_second = now;
    refusal_lines = 0;
  }
  if (refusal_lines < kRefusalLinesPerSecond) {
    ++refusal_lines;
    BATON_LOG(WARN, kLog) << "refused " << who << ": " << reason
                          << (refusals_unlogged == 0
                                  ? ""
                                  : " (" + std::to_string(refusals_unlogged) +
                                        " refusals before it not logged: more than " +
                                        std::to_string(kRefusalLinesPerSecond) + " a second)");
    refusals_unlogged = 0;
  } else {
    ++refusals_unlogged;
  }
  refusals.push_back(Refusal{clock.Now(), who, reason});
  if (refusals.size() > kKeepRefusals) refusals.pop_front();
  ++refusal_count;
}

void CoordinatorState::RecordExit(const EngineRecord& e, const std::string& cause,
                                  const std::string& exit) {
  exits.push_back(EngineExit{clock.Now(), e.id, e.pid, e.launch_role, cause, exit});
  if (exits.size() > kKeepExits) exits.pop_front();
}

void CoordinatorState::Forget(EngineId id) {
  constexpr size_t kKeepDeparted = 32;
  auto it = engines.find(id);
  if (it == engines.end()) return;
  // Both runs are in time order already: one merge keeps the whole in it.
  const auto middle = static_cast<std::ptrdiff_t>(departed_history.size());
  for (const EngineMachine::Record& r : it->second->machine.history()) {
    departed_history.emplace_back(id, r);
  }
  std::inplace_merge(departed_history.begin(), departed_history.begin() + middle,
                     departed_history.end(),
                     [](const auto& a, const auto& b) { return a.second.at < b.second.at; });
  while (departed_history.size() > kKeepDeparted) departed_history.pop_front();
  engines.erase(it);
}

void CoordinatorState::CheckInvariants() {
  if (!invariants.ok()) return;  // the first violation stays for `batonctl status`
  Status status = ledger->CheckInvariants();
  if (status.ok()) return;
  invariants = std::move(status);
  BATON_LOG(ERROR, kLog) << "fencing invariant violated: " << invariants.message();
}

// --- epochs -------------------------------------------------------------------------------------

Result<uint64_t> CoordinatorState::AdvanceEpoch() {
  Result<uint64_t> epoch = epochs.Advance();
  if (!epoch.ok()) {
    BATON_LOG(ERROR, kLog) << "cannot make a new epoch durable, promotions are held: "
                           << epoch.status().ToString();
  }
  NoteJournalState();
  return epoch;
}

void CoordinatorState::NoteJournalState() {
  const bool failing = !epochs.last_write().ok();
  if (journal_failing && !failing) {
    BATON_LOG(INFO, kLog) << "epoch journal can be written again (" << epochs.write_failures()
                          << " writes failed since the start)";
  }
  journal_failing = failing;
}

}  // namespace baton
