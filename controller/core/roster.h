// Roster: the engines a controller runs and what each may hold, kept in the state directory
// (<state_dir>/roster.json) so that a controller that crashed, or was replaced by a newer
// version, finds its engines again.
//
// The Coordinator writes it before it sends anything the roster must know: a launch token
// before the engine can use it, a grant or a promotion (its extents, its epoch) before the
// engine can map them. So after a crash the roster lists at least what any engine may hold:
// an engine that claims more, another epoch, or a token the roster does not have cannot be
// accounted for and is fenced. An engine that claims less (a grant it never received, a
// return the controller saw but did not write down) is believed, as a return is.
//
// `boot_id` (/proc/sys/kernel/random/boot_id) tells a roster of a previous boot, whose
// engines are all gone; `start_time` (field 22 of /proc/<pid>/stat) tells a recycled pid.
// The file is JSON with a format number; a roster that does not parse is refused with the
// reason (the caller fences every process it cannot account for, which is all of them).
// `sequence` and `checksum` are for a file kept in two slots written in place
// (controller/roster_file.h): which slot is newer, and whether a slot is whole; a roster
// without them (an older controller's) decodes with both 0.
// Plain values and functions; thread-compatible.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "controller/core/pool_ledger.h"
#include "proto/roles.h"

namespace baton {

// What an engine was doing, as the roster keeps it.
enum class RosterRole : uint8_t {
  kLaunching,  // launched, not yet a ready standby
  kStandby,
  kPromoting,  // Promote sent (with `epoch` and `extents`), no PromoteAck yet
  kServing,    // the primary, or a serving canary
  kDraining,
  kFencing,  // killed; its exit and barrier are awaited
};
const char* ToString(RosterRole role);
Result<RosterRole> ParseRosterRole(const std::string& text);

struct RosterEngine {
  EngineId id = kNoEngine;
  pid_t pid = 0;
  uint64_t start_time = 0;  // clock ticks after boot (/proc/<pid>/stat); 0: unknown
  std::string token;
  proto::LaunchRole launch_role = proto::LaunchRole::kStandby;
  int port = 0;
  std::vector<std::string> command;
  std::string cgroup;  // the engine's cgroup directory, or ""
  RosterRole role = RosterRole::kLaunching;
  uint64_t epoch = 0;           // the epoch of its leases (0: a standby)
  std::vector<Extent> extents;  // blocks it may hold at `epoch`
  std::string version;
  std::string http_address;
  // CUDA backend: "mapped", why the engine declined the device regions, or "" (not offered);
  // absent from rosters written before it was recorded.
  std::string device_memory;
  bool operator==(const RosterEngine&) const = default;
};

struct Roster {
  static constexpr int kFormat = 1;
  std::string boot_id;
  uint64_t incarnation = 0;  // starts of controllers on this state directory, this one included
  EngineId next_engine_id = 1;
  EngineId primary = kNoEngine;
  bool pair_draining = false;  // `batonctl drain` took the pair out of service
  std::vector<RosterEngine> engines;
  uint64_t sequence = 0;  // rosters written by this state directory's controllers, this one
  uint32_t checksum = 0;  // CRC32C of the encoding with checksum 0 (0: not checked)
  bool operator==(const Roster&) const = default;

  const RosterEngine* Find(EngineId id) const;
};

std::string EncodeRoster(const Roster& roster);
// InvalidArgument naming `where` and the field when the text is not a roster of a format
// this build reads.
Result<Roster> DecodeRoster(const std::string& text, const std::string& where);

}  // namespace baton
