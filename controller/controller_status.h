// ControllerStatus: one read-only copy of the daemon's whole status for `batonctl status`,
// `batonctl timeline` and /metrics (controller/ctl/): the Coordinator's decisions
// (CoordinatorStatus) and what only the daemon holds: the memory, the journal, the
// cgroups, the routers, the process itself. Taken with Controller::Snapshot(); plain values.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "controller/config.h"
#include "controller/core/coordinator_status.h"
#include "controller/keeper/keeper_watch.h"
#include "controller/rollout/rollout_record.h"
#include "cuda/device_owner.h"
#include "fleet/node_registrar.h"
#include "proto/messages.h"

namespace baton {

struct WeightsStatus {
  std::string model_dir;
  size_t tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t arena_bytes = 0;
  int64_t resident_bytes = -1;
  bool huge_pages = false;   // the arena, or the first part of a partial one, is on 2 MiB pages
  uint64_t huge_bytes = 0;   // of arena_bytes, on 2 MiB pages
  uint64_t small_bytes = 0;  // on 4 KiB pages (a partial arena's rest, or all of it)
  int numa_node = 0;
  bool numa_bound = false;
  std::string numa_source;
  bool locked = false;
  bool lock_pending = false;  // an adopted arena's background mlock has not finished
  std::string load_method;    // "adopted" when taken over from a previous controller
  double load_s = 0;
  double load_gbps = 0;
  uint64_t bytes_read = 0;  // from the model files, by this controller
  std::vector<std::string> warnings;
  // "" while the arena holds what the model files hold; else why it does not (kept weights
  // serving while the changed files do not load).
  std::string files_differ;
};

struct PoolStatus {
  uint64_t bytes = 0;
  bool huge_pages = false;
  std::string huge_pages_fallback;
  bool adopted = false;
};

struct JournalStatus {
  uint64_t durable = 0;
  uint64_t reserved = 0;
  uint64_t reserve_batch = 0;
  Status last_write;
  uint64_t write_failures = 0;
};

struct DeviceStatus {
  bool present = false;
  int device = -1;
  std::string describe;
  DeviceOwnerStats stats;
  std::optional<bool> nvml_lists_engines;
  bool adopted = false;   // the device memory is the previous controller's (baton-keeper)
  std::string made_anew;  // why not, when it is not
};

struct ControllerStatus {
  CoordinatorStatus core;
  const ControllerConfig* config = nullptr;
  pid_t pid = 0;
  TimePoint started_at{};
  // Controllers started on this state directory before this one (0: the first).
  uint64_t restarts = 0;
  WeightsStatus weights;
  PoolStatus pool;
  JournalStatus journal;
  DeviceStatus device;
  std::string cgroup_base;  // "" when fencing uses process groups only
  std::string cgroups_off_reason;
  size_t leftovers_killed = 0;
  size_t cgroups_awaiting_removal = 0;  // of gone engines, swept every 10 ms (RetiredCgroups)
  std::map<EngineId, std::string> engine_cgroups;
  std::map<EngineId, double> engine_cpu_s;
  // Engines whose liveness page is watched: their death is seen before their teardown.
  std::set<EngineId> liveness_watched;
  proto::RouteTable routes;
  size_t route_subscribers = 0;
  size_t client_send_queued_bytes = 0;
  KeeperStatus keeper;  // baton-keeper: keeping, restarting, unavailable or off
  // [fleet]: the node's key in etcd and its registration; no key without [fleet].
  std::string fleet_key;
  NodeRegistration fleet;
  RolloutSnapshot rollout;  // what this node saw of fleet-wide upgrades ([fleet] only)
};

}  // namespace baton
