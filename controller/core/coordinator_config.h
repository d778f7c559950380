// CoordinatorConfig: the part of the controller's configuration (controller/config.h, which
// parses it from TOML and flags; docs/operations.md lists every key) that the Coordinator
// reads: timeouts, the pool's shape, the health checks, the crash-loop policy, the canary
// policy. ControllerConfig extends it with what only the daemon reads.
//
// Plain values; thread-compatible.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/clock.h"
#include "controller/core/canary.h"
#include "controller/core/crash_loop_guard.h"

namespace baton {

struct CoordinatorConfig {
  // [controller]
  std::string state_dir;  // the epoch journal; default <runtime_dir>/state
  // A restarted controller waits this long for the previous one's engines to register
  // again; those that do not are fenced (controller/core/coordinator_recovery.cc).
  Duration readopt_timeout = std::chrono::seconds(2);

  // [engine]
  std::vector<std::string> engine_command;
  int base_port = 0;  // {port} is base_port + k, k < port_count, free at launch
  int port_count = 4;
  Duration register_timeout = std::chrono::seconds(60);
  Duration promote_timeout = std::chrono::seconds(5);
  Duration drain_timeout = std::chrono::seconds(10);

  // [pool]
  uint32_t block_count = 256;
  uint32_t initial_grant_blocks = 0;  // blocks granted at a promotion from free; 0: all free
  // Free blocks kept back from the primary so that a failover's promotion starts on them at
  // once, while the dead primary's blocks wait in quarantine for its barrier (whole chunks on
  // a device pool; at most half the pool, else there is none). -1: a sixteenth of the pool
  // (at least 1); 0: none (every promotion waits for the barrier).
  int promotion_reserve_blocks = -1;

  // [gpu]
  // CUDA backend: how long the barrier waits for NVML to stop listing a reaped holder.
  Duration gpu_release_timeout = std::chrono::seconds(5);
  // CUDA backend: how often the controller checks that its device still works (0: never).
  Duration gpu_probe_interval = std::chrono::seconds(1);

  // [health]
  Duration heartbeat_interval = std::chrono::milliseconds(100);
  int heartbeat_misses = 3;
  Duration probe_timeout = std::chrono::milliseconds(100);
  // An engine that reports its progress (proto::Progress) and has requests pending while its
  // step count stands still this long is fenced as hung, if it is the primary or a canary
  // (controller/core/progress_watch.h). Per step: it must exceed the engine's longest step
  // (the first prefill of the longest prompt). Zero: no such check.
  Duration compute_stall_timeout = std::chrono::seconds(30);

  // [policy]
  CrashLoopGuard::Options crash;  // max_failures, window, initial_/max_backoff, quiet_period
  // After a failover or switch-over, the replacement standby is launched this long after the
  // new primary acknowledged its promotion, so that its start (exec, mapping and faulting
  // the weights) does not compete with the new primary's first steps: the requests the
  // router replays. Zero launches it at once.
  Duration standby_relaunch_delay = std::chrono::milliseconds(100);

  // [upgrade]: how `batonctl upgrade` walks a canary (controller/core/canary.h).
  CanaryPolicy canary;

  std::string command_record_path() const { return state_dir + "/engine_command.json"; }
};

}  // namespace baton
