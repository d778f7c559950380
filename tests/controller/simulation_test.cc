// Deterministic randomized simulation of the controller: the production Coordinator
// (controller/core/coordinator.h), acting only through SimEffects on a model of the world
// (sim_world.h), driven by a seeded PRNG (sim_driver.h) through grants, returns, deaths,
// hangs, error reports, drills, stale and forged messages, every operator command (switch-over,
// upgrade, rollback, drain, resume, stop), canaries judged on a modelled router's outcomes,
// device losses, and controller crashes and restarts with re-adoption of the running engines,
// on a fake clock.
// After every step fencing rules 1-5 are checked twice: against ground truth (SimWorld) and
// by the ledger's own CheckInvariants; the Coordinator must refuse no transition, see no
// violation of its own and count no BATON_BUG; what the operator's commands promise of the
// engines left running must hold (sim_driver.h). A failing seed is printed with its step log.
// SimulationMutants proves the checks bite: each deliberate fault (in the ledger, in each
// part of the Coordinator, in the epoch store, in the effects) is caught within a few seeds.
//
//   BATON_SIM_SEED=1234  replay one seed and print its step log
//   BATON_SIM_SEEDS=N    number of seeds (default 10000)
//   BATON_SIM_FIRST_SEED=N  the first seed (default 1; both sweeps): long sweeps of fresh seeds
//   BATON_SIM_STEPS=N    steps per seed (default 200)
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "base/bug.h"
#include "base/log.h"
#include "tests/controller/sim_driver.h"

namespace baton::sim {
namespace {

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

Outcome RunSeed(uint64_t seed, const Fault& fault = {}, bool verbose = false) {
  const int steps = static_cast<int>(EnvOr("BATON_SIM_STEPS", 200));
  return Simulation(seed, steps, fault, verbose).Run();
}

std::string Report(uint64_t seed, const Outcome& out) {
  std::ostringstream s;
  s << "seed " << seed << " failed at "
    << (out.step >= 0 ? "step " + std::to_string(out.step) : std::string("settling")) << ": "
    << out.violation << "\nreplay: BATON_SIM_SEED=" << seed
    << " baton_controller_tests --gtest_filter='Simulation.*'\n";
  for (const std::string& line : out.log) s << "  " << line << "\n";
  return s.str();
}

// The Coordinator logs every decision; a run of millions of steps logs nothing, not even the
// errors it provokes on purpose (a device lost every few seeds): a failing seed is reported
// with its step log, and a replayed one shows the Coordinator's logs with BATON_LOG_LEVEL.
class QuietLogs {
 public:
  QuietLogs() : saved_(GetLogLevel()) {
    if (std::getenv("BATON_LOG_LEVEL") == nullptr) SetLogLevel(kSilent);
  }
  ~QuietLogs() { SetLogLevel(saved_); }

 private:
  // Above every level BATON_LOG writes.
  static constexpr LogLevel kSilent = static_cast<LogLevel>(static_cast<int>(LogLevel::kError) + 1);
  LogLevel saved_;
};

TEST(Simulation, EverySeedKeepsTheFencingRules) {
  QuietLogs quiet;
  if (std::getenv("BATON_SIM_SEED") != nullptr) {
    const uint64_t seed = EnvOr("BATON_SIM_SEED", 0);
    Outcome out = RunSeed(seed, {}, /*verbose=*/true);
    for (const std::string& line : out.log) std::cout << line << "\n";
    ASSERT_TRUE(out.ok) << Report(seed, out);
    return;
  }
  const uint64_t seeds = EnvOr("BATON_SIM_SEEDS", 10000);
  const uint64_t first = EnvOr("BATON_SIM_FIRST_SEED", 1);
  const uint64_t bugs_before = BugCount();  // each one aborts here (base/bug.h)
  Stats total;
  for (uint64_t seed = first; seed < first + seeds; ++seed) {
    Outcome out = RunSeed(seed);
    total.Add(out.stats);
    if (!out.ok) FAIL() << Report(seed, RunSeed(seed, {}, /*verbose=*/true));
  }
  std::cout << seeds << " seeds, " << total.steps << " steps: " << total.promotions
            << " promotions, " << total.restarts << " controller restarts, " << total.readopts
            << " re-adoptions, " << total.switchovers << " switch-overs, " << total.refused_stale
            << " stale and " << total.refused_forged << " forged messages refused, "
            << total.hang_kills << " hung engines killed, " << total.backoff_steps
            << " steps in backoff; kv: " << total.kv_adopted << " sequences adopted, "
            << total.kv_dropped << " dropped (" << total.kv_torn << " torn), " << total.kv_continued
            << " requests continued, " << total.kv_malformed << " malformed reports; promotions "
            << total.before_barrier << " before the barrier, " << total.after_barrier
            << " after it; quarantined kv copied " << total.inherit_copied << " times ("
            << total.kv_copied << " sequences, " << total.kv_changed
            << " dropped as changed), waited for " << total.inherit_waited << " times ("
            << total.inherit_timed_out << " to the wait limit); " << total.ghost_steps
            << " steps of dying engines; commands: " << total.upgrades << " upgrades ("
            << total.upgrades_promoted << " promoted, " << total.upgrades_rolled_back
            << " rolled back), " << total.rollbacks << " rollbacks, " << total.drains << " drains, "
            << total.resumes << " resumes, " << total.shutdowns << " shutdowns; "
            << total.device_losses << " device losses (" << total.device_rebuilds << " rebuilds); "
            << BugCount() - bugs_before << " bugs\n";
  EXPECT_EQ(BugCount(), bugs_before);
  // The run must actually reach the interesting paths.
  EXPECT_GT(total.restarts, seeds / 2);
  EXPECT_GT(total.readopts, seeds / 2);
  EXPECT_GT(total.promotions, seeds);
  EXPECT_GT(total.hang_kills, 0u);
  EXPECT_GT(total.switchovers, 0u);
  EXPECT_GT(total.refused_stale, 0u);
  EXPECT_GT(total.refused_forged, 0u);
  EXPECT_GT(total.backoff_steps, 0u);
  EXPECT_GT(total.kv_adopted, seeds / 10);
  EXPECT_GT(total.kv_torn, 0u);
  EXPECT_GT(total.kv_continued, 0u);
  EXPECT_GT(total.kv_malformed, 0u);
  EXPECT_GT(total.before_barrier, seeds);
  EXPECT_GT(total.after_barrier, seeds);
  EXPECT_GT(total.inherit_copied, 0u);
  EXPECT_GT(total.inherit_waited, 0u);
  EXPECT_GT(total.kv_copied, 0u);
  EXPECT_GT(total.kv_changed, 0u);
  EXPECT_GT(total.ghost_steps, seeds);
  // Every operator command, both ends of a canary, and device losses.
  EXPECT_GT(total.upgrades, seeds / 10);
  EXPECT_GT(total.upgrades_promoted, 0u);
  EXPECT_GT(total.upgrades_rolled_back, 0u);
  EXPECT_GT(total.rollbacks, 0u);
  EXPECT_GT(total.drains, 0u);
  EXPECT_GT(total.resumes, 0u);
  EXPECT_GT(total.shutdowns, 0u);
  EXPECT_GT(total.device_losses, 0u);
  EXPECT_GT(total.device_rebuilds, 0u);
}

// The same on a device pool of 4-block chunks (blocks 28 and 29 in a short last chunk):
// grants never put two engines in one chunk, across promotions and controller restarts.
TEST(Simulation, ChunkedPoolSeedsKeepTheFencingRules) {
  QuietLogs quiet;
  const Fault chunked{.blocks = 30, .blocks_per_chunk = 4};
  const uint64_t seeds = EnvOr("BATON_SIM_SEEDS", 10000) / 5;
  const uint64_t first = EnvOr("BATON_SIM_FIRST_SEED", 1);
  Stats total;
  for (uint64_t seed = first; seed < first + seeds; ++seed) {
    Outcome out = RunSeed(seed, chunked);
    total.Add(out.stats);
    if (!out.ok) FAIL() << Report(seed, RunSeed(seed, chunked, /*verbose=*/true));
  }
  EXPECT_GT(total.promotions, seeds);
  EXPECT_GT(total.readopts, 0u);
}

// Seeds of long sweeps (BATON_SIM_FIRST_SEED) that once failed, each with the steps it ran:
// what they found stays fixed.
TEST(Simulation, SeedsThatOnceFailedPass) {
  QuietLogs quiet;
  struct Found {
    uint64_t seed;
    int steps;
    const char* what;
  };
  for (const Found& f : {
           // The primary gave up a block right after the reserve's Reclaim: taken for its
           // answer, and the answer, past a release that filled the reserve, stayed free.
           Found{1118701, 400, "a Reclaim's late answer stranded beside a full reserve"},
           // The same for a canary's Reclaim, its upgrade rolled back before the answer came.
           Found{1121954, 400, "a canary's Reclaim answered late after its rollback"},
           // The model's own: a Reclaim's answer queued behind the engine's earlier messages
           // arrived later than the model thought, and a second return of its blocks, which
           // the controller rightly took, was flagged.
           Found{1161389, 400, "a Reclaim's answer behind the engine's queue"},
           // A restart during the canary's promotion left the pair degraded, and a canary that
           // passed every step waited for a ready pair forever.
           Found{1231602, 400, "an upgrade resumed at the canary's promotion never finished"},
           // Two returns of the primary's own before the reserve's Reclaim was answered: the
           // second closed the window for a late answer, and the answer stayed free.
           Found{1867222, 400, "a Reclaim answered after two returns of the engine's own"},
           // A canary at 100 % beside a primary that had served too little to compare its
           // latency with: the last step held for ever.
           Found{2269628, 400, "a canary's last step held with no latency to judge by"},
           // The model's own: a hung canary's return was replayed after its blocks had been
           // granted back to it, a message no live engine sends again, and the blocks went
           // to the primary while the canary still mapped them.
           Found{2316030, 400, "a hung engine's current return replayed"},
           // A return of the primary's own as large as the reserve's Reclaim was taken for
           // its whole answer: the answer, past a release that filled the reserve, stayed
           // free for nobody.
           Found{3317105, 400, "a Reclaim answered after a return of its size"},
           // The model's own: a dead engine's return, whose blocks the controller had given
           // straight back to it (its upgrade's Reclaim over), was replayed at its epoch before
           // its death was seen, a message it never sent again, and the blocks went to the
           // canary while the dead engine's teardown still mapped them.
           Found{392002, 400, "a dead engine's current return replayed"},
       }) {
    Outcome out = Simulation(f.seed, f.steps, {}, false).Run();
    if (!out.ok) {
      FAIL() << f.what << ": " << Report(f.seed, Simulation(f.seed, f.steps, {}, true).Run())
             << "(with BATON_SIM_STEPS=" << f.steps << ")";
    }
  }
}

TEST(Simulation, SameSeedReplaysIdentically) {
  QuietLogs quiet;
  for (uint64_t seed : {7u, 4242u}) {
    Outcome a = RunSeed(seed, {}, true);
    Outcome b = RunSeed(seed, {}, true);
    ASSERT_EQ(a.log, b.log);
    EXPECT_FALSE(a.log.empty());
    // Logging does not change the run: a failing seed replays the same way verbosely.
    Outcome quiet_run = RunSeed(seed);
    EXPECT_EQ(quiet_run.stats.steps, a.stats.steps);
    EXPECT_EQ(quiet_run.stats.promotions, a.stats.promotions);
    EXPECT_EQ(quiet_run.stats.refused_stale, a.stats.refused_stale);
    EXPECT_EQ(quiet_run.stats.readopts, a.stats.readopts);
  }
}

// Each deliberate fault must be caught, under the rule it breaks, within a few seeds: the
// simulation cannot pass silently.
struct MutantCase {
  const char* name;
  Fault fault;
  std::vector<std::string> rules;
};

void PrintTo(const MutantCase& c, std::ostream* os) { *os << c.name; }

class SimulationMutants : public ::testing::TestWithParam<MutantCase> {};

TEST_P(SimulationMutants, AreCaught) {
  QuietLogs quiet;
  // A deliberate fault may make the coordinator's own ledger commands refused (a bug it
  // counts) before the invariants catch it: counted here, not aborting.
  SetAbortOnBug(false);
  struct Restore {
    ~Restore() { SetAbortOnBug(true); }
  } restore;
  const MutantCase& c = GetParam();
  for (uint64_t seed = 1; seed <= 2000; ++seed) {
    Outcome out = RunSeed(seed, c.fault);
    if (out.ok) continue;
    bool named = false;
    for (const std::string& rule : c.rules) named |= out.violation.rfind(rule, 0) == 0;
    EXPECT_TRUE(named) << c.name << ": " << Report(seed, RunSeed(seed, c.fault, true));
    std::cout << c.name << ": caught by seed " << seed << ": " << out.violation << "\n";
    return;
  }
  FAIL() << c.name << ": no seed out of 2000 caught the fault";
}

INSTANTIATE_TEST_SUITE_P(
    Faults, SimulationMutants,
    // Blocks handed on before their barrier are caught as a second writer (rule 1), a use
    // before the barrier (rule 2), or KV read from a writer not past it (rule 6), whichever
    // the seed meets first.
    ::testing::Values(
        MutantCase{"ledger fence frees blocks at once",
                   {.mutation = PoolLedger::Mutation::kSkipQuarantine},
                   {"invariant 1", "invariant 2", "invariant 6"}},
        MutantCase{"ledger accepts stale epochs",
                   {.mutation = PoolLedger::Mutation::kAcceptStale},
                   {"invariant 4"}},
        MutantCase{"ledger grants to a standby",
                   {.mutation = PoolLedger::Mutation::kGrantToStandby},
                   {"invariant 5"}},
        MutantCase{"epoch used before fsync", {.skip_fsync = true}, {"invariant 3"}},
        MutantCase{"barrier skipped", {.skip_barrier = true}, {"invariant 2", "invariant 6"}},
        MutantCase{"release before reaping",
                   {.release_at_once = true},
                   {"invariant 1", "invariant 2", "invariant 6"}},
        MutantCase{"quarantined block handed on before its barrier",
                   {.mutation = PoolLedger::Mutation::kHandOnQuarantined, .reserve = -1},
                   {"invariant 1", "invariant 2", "invariant 6"}},
        // One fault in each part of the Coordinator (coordinator_mutation.h).
        MutantCase{"engines accept epoch 0 from any engine",
                   {.part = CoordinatorMutation::kAcceptEpochZero},
                   {"invariant 4"}},
        // Rule 3, refused by the ledger: the coordinator's own command refused is a bug.
        MutantCase{"failover promotes at the old primary epoch",
                   {.part = CoordinatorMutation::kPromoteAtOldEpoch, .reserve = -1},
                   {"bug"}},
        // A spared engine still writes: its blocks reach another engine as a second writer,
        // a use before the barrier, or KV adopted from a writer that is not dead.
        MutantCase{"recovery spares engines silent at the deadline",
                   {.part = CoordinatorMutation::kSpareSilentEngines},
                   {"invariant 1", "invariant 2", "invariant 6"}},
        // Caught by the two serving engines, or by a restart that finds the canary still
        // serving where its roster says no engine serves.
        MutantCase{"upgrade rollback leaves the canary serving",
                   {.part = CoordinatorMutation::kRollbackKeepsCanary},
                   {"rollout", "recovery: an engine reattached with the truth and was refused"}},
        MutantCase{"device loss fences no engine",
                   {.part = CoordinatorMutation::kDeviceLossFencesNothing},
                   {"device"}},
        MutantCase{"drain leaves the standby running",
                   {.part = CoordinatorMutation::kDrainSparesStandby},
                   {"drain"}}),
    [](const ::testing::TestParamInfo<MutantCase>& info) {
      std::string name = info.param.name;
      for (char& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return name;
    });

}  // namespace
}  // namespace baton::sim
