// EngineLogs: keeps engine.log_dir bounded. Each engine writes its stdout and stderr to
// <dir>/engine-<id>.log, opened O_APPEND by the Supervisor. Engines outlive the controller, so
// their output cannot pass through it; instead:
//   * every 5 s, a log longer than `max_bytes` is copied to engine-<id>.log.1 (replacing the
//     older copy) and truncated in place ("copytruncate": the engine's O_APPEND descriptor
//     goes on writing at the new end; what it writes between the copy and the truncation is
//     lost, at most a few lines);
//   * the log of an engine that crashed (KeepCrashed: it failed, rather than being retired)
//     is renamed engine-<id>.crash.log (and its copy .crash.log.1), so that the evidence of a
//     crash is not pruned with the logs of the engines launched after it; crash logs are not
//     rotated;
//   * at each launch (Prune), only the logs of the live engines and of the `keep` most recent
//     engine ids stay, and the crash logs of the `crash_keep` most recent crashed ids; older
//     ones and their .1 copies are deleted (a failover, a crash loop, an upgrade each start a
//     new id).
// So the directory holds at most (live + keep + crash_keep) x 2 x max_bytes. max_bytes 0: no
// rotation; crash_keep 0: crash logs are not kept apart.
//
// Owned by the Controller; thread: the io_context thread (the copy of a full log, in the
// kernel with copy_file_range, holds it for milliseconds every max_bytes of engine output).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <set>
#include <string>

#include "base/status.h"

namespace baton {

class EngineLogs {
 public:
  EngineLogs(boost::asio::io_context& io, std::string dir, uint64_t max_bytes, size_t keep,
             size_t crash_keep = 0);
  // Starts the rotation timer (nothing without a directory).
  void Start();
  // Deletes the logs of engines neither in `live` nor among the `keep` highest ids, and the
  // crash logs of all but the `crash_keep` highest crashed ids.
  void Prune(const std::set<uint64_t>& live);
  // Engine `id` crashed: its log (and copy) renamed to engine-<id>.crash.log(.1). Returns the
  // crash log's path; "" without a directory, a log or crash_keep (nothing renamed).
  std::string KeepCrashed(uint64_t id);
  // One rotation pass now; the number of logs rotated.
  size_t RotateNow();
  // The last line engine `id` wrote to its log (at most 240 bytes, control bytes replaced),
  // "" without a log directory or a line: what an engine that exits says last, for the
  // controller's own log.
  std::string LastLine(uint64_t id) const;
  uint64_t rotations() const { return rotations_; }
  uint64_t deleted() const { return deleted_; }

 private:
  void Arm();
  Status Rotate(const std::string& path);

  boost::asio::steady_timer timer_;
  const std::string dir_;
  const uint64_t max_bytes_;
  const size_t keep_;
  const size_t crash_keep_;
  uint64_t rotations_ = 0;
  uint64_t deleted_ = 0;
};

// The engine id of "engine-<id>.log", "engine-<id>.log.1", "engine-<id>.crash.log" or
// "engine-<id>.crash.log.1"; 0 for any other name.
uint64_t EngineLogId(const std::string& file_name);
// Whether `file_name` is a crash log or its copy (engine-<id>.crash.log, .crash.log.1).
bool IsCrashLog(const std::string& file_name);

}  // namespace baton
