// What one run of the controller simulation (sim_driver.h) is given, and what it returns:
// the deliberate fault it carries (if any) and the pool's shape, the ControllerConfig its
// Coordinator runs with, what it counted and whether a rule broke, with its step log.
// Plain values; header-only test support.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "controller/config.h"
#include "controller/core/coordinator_mutation.h"
#include "controller/core/pool_ledger.h"

namespace baton::sim {

// A deliberate fault, for the tests that prove the checks catch one: in the ledger, in one of
// the Coordinator's parts (coordinator_mutation.h), in the epoch store (epochs handed out
// before they are durable), or in the effects (sim_effects.h).
struct Fault {
  PoolLedger::Mutation mutation = PoolLedger::Mutation::kNone;
  CoordinatorMutation part = CoordinatorMutation::kNone;
  bool skip_fsync = false;       // SimEpochStore::skip_fsync
  bool skip_barrier = false;     // SimFaults::skip_barrier
  bool release_at_once = false;  // SimFaults::release_at_once
  // Not a fault: the pool's shape, a device pool mapped by chunks when above 1, and its
  // promotion reserve (pool.promotion_reserve_blocks; kRandomReserve: chosen per seed).
  uint32_t blocks = 32;
  uint32_t blocks_per_chunk = 1;
  int reserve = kRandomReserve;
  static constexpr int kRandomReserve = -2;
};

// What a run reached (the test requires the interesting paths to be reached at all).
struct Stats {
  uint64_t steps = 0, promotions = 0, restarts = 0, readopts = 0;
  uint64_t refused_stale = 0, refused_forged = 0, switchovers = 0, backoff_steps = 0;
  uint64_t hang_kills = 0;
  // KV-warm failover (sim_kv.h): sequences adopted, dropped (torn among them), requests
  // continued from adopted KV, adoption reports sent malformed.
  uint64_t kv_adopted = 0, kv_dropped = 0, kv_torn = 0, kv_continued = 0, kv_malformed = 0;
  // Promotions before the old primary's barrier (on the reserve) and after it; of those
  // before, how the quarantined KV was taken (copied, waited for), waits that ran to their
  // limit (the blocks never came: their KV replayed); sequences copied and
  // copies dropped because the dying writer changed their records; steps that writer made.
  uint64_t before_barrier = 0, after_barrier = 0, inherit_copied = 0, inherit_waited = 0;
  uint64_t inherit_timed_out = 0, kv_copied = 0, kv_changed = 0, ghost_steps = 0;
  // Operator commands accepted (batonctl upgrade, rollback, drain, resume, stop), what became
  // of the upgrades (promoted, rolled back: by the judge, the operator or a failure), and
  // device losses the controller detected and device memory it rebuilt.
  uint64_t upgrades = 0, rollbacks = 0, drains = 0, resumes = 0, shutdowns = 0;
  uint64_t upgrades_promoted = 0, upgrades_rolled_back = 0;
  uint64_t device_losses = 0, device_rebuilds = 0;
  void Add(const Stats& o) {
    upgrades += o.upgrades, rollbacks += o.rollbacks, drains += o.drains;
    resumes += o.resumes, shutdowns += o.shutdowns;
    upgrades_promoted += o.upgrades_promoted, upgrades_rolled_back += o.upgrades_rolled_back;
    device_losses += o.device_losses, device_rebuilds += o.device_rebuilds;
    before_barrier += o.before_barrier, after_barrier += o.after_barrier;
    inherit_copied += o.inherit_copied, inherit_waited += o.inherit_waited;
    inherit_timed_out += o.inherit_timed_out;
    kv_copied += o.kv_copied, kv_changed += o.kv_changed, ghost_steps += o.ghost_steps;
    steps += o.steps, promotions += o.promotions, restarts += o.restarts;
    readopts += o.readopts;
    refused_stale += o.refused_stale, refused_forged += o.refused_forged;
    switchovers += o.switchovers, backoff_steps += o.backoff_steps, hang_kills += o.hang_kills;
    kv_adopted += o.kv_adopted, kv_dropped += o.kv_dropped, kv_torn += o.kv_torn;
    kv_continued += o.kv_continued, kv_malformed += o.kv_malformed;
  }
};

// A run's verdict: the first rule broken, at which step, with the step log (verbose runs).
struct Outcome {
  bool ok = true;
  int step = -1;  // -1: the final settling phase
  std::string violation;
  std::vector<std::string> log;
  Stats stats;
};

// The configuration the simulated controller runs with: what the Coordinator reads, with
// timeouts short enough for a run of 200 steps to cross each of them many times.
inline ControllerConfig SimConfig(const Fault& fault) {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  ControllerConfig c;
  c.block_count = fault.blocks;
  c.initial_grant_blocks = 0;
  c.engine_command = {"sim-engine"};
  c.base_port = 8100;
  c.heartbeat_interval = milliseconds(100);
  c.heartbeat_misses = 3;
  c.probe_timeout = milliseconds(100);
  c.register_timeout = seconds(1);
  c.promote_timeout = milliseconds(500);
  c.drain_timeout = seconds(1);
  c.crash.max_failures = 3;
  c.crash.window = seconds(2);
  c.crash.initial_backoff = milliseconds(200);
  c.crash.max_backoff = seconds(2);
  c.crash.quiet_period = seconds(5);
  c.readopt_timeout = milliseconds(300);
  c.standby_relaunch_delay = milliseconds(100);
  c.gpu_release_timeout = seconds(2);
  c.gpu_probe_interval = Duration::zero();  // the CUDA backend's seeds probe (sim_driver.h)
  c.stop_grace = seconds(1);
  // A canary judged in two short steps on what the modelled router saw (sim_services.h).
  c.canary.steps = {50, 100};
  c.canary.step_duration = milliseconds(150);
  c.canary.min_requests = 5;
  c.canary.latency_warmup_requests = 0;
  return c;
}

}  // namespace baton::sim
