// Promotion timeline: what happened, phase by phase, in each failover, switch-over or
// first promotion, for `batonctl timeline` and the controller's log.
//
// The controller opens a PromotionRecord when it detects the loss of a primary (or starts a
// planned switch-over, or promotes the first engine) and stamps each phase as it happens:
//   requested       the hand-over was asked for: `batonctl promote`, or the canary passed every
//                   step (switch-overs and upgrades: the old primary is told to drain)
//   injected        a drill's kill / stop / error was sent (drills only)
//   last_heartbeat  the last heartbeat the old primary sent (hangs)
//   detected        pidfd readable, socket EOF, hang confirmed, error report, drained
//   killed          SIGKILL sent through the pidfd (absent when it was already dead)
//   epoch_durable   the new epoch is fsynced in the journal
//   reaped          waitid(P_PIDFD) returned
//   gpu_released    CUDA backend: the poll that found no process of the old primary left
//                   (NVML no longer lists it); absent when the wait gave up after
//                   gpu.release_timeout_ms (`barrier_timed_out` then)
//   barrier_passed  no process of the old primary's group or cgroup is left (and NVML lists
//                   none): its quarantined blocks move on
//   promote_sent    Promote sent to the standby: on the promotion reserve, before the
//                   barrier, or with the old primary's blocks after it (`waited` says why)
//   promote_acked   the new primary mapped its blocks and serves
//   kv_adopted      the new primary said what it adopted of the old one's KV (KvAdopted)
//   route_published the route table names the new primary
//   standby_launched / standby_ready  the replacement standby
// A promotion before the barrier is acknowledged before the old primary's teardown ends: the
// record is closed then and still takes reaped, gpu_released and barrier_passed.
// `epoch` is the epoch the new primary serves at: the old primary's fence epoch (`fence_epoch`)
// after a failover or a switch-over, the canary's own (earlier) epoch when a canary takes over.
// Phase durations: detect (evidence -> detected, where the evidence is the drill, the request
// or the last heartbeat), fence (detected -> reaped), promote
// (reaped -> promote_acked, or promote_sent -> promote_acked when the promotion did not wait
// for the reap), ready (detected -> route_published), teardown (detected -> barrier_passed).
//
// Ownership: the Coordinator owns one TimelineLog (bounded, in CoordinatorState). Thread: the
// Coordinator's.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"
#include "proto/messages.h"

namespace baton {

// What a timeline records. Its name is written only by the timeline's JSON, text and log line.
enum class PromotionKind : uint8_t {
  kFailover,    // the primary failed and the standby takes over
  kDrain,       // the primary failed while it drained
  kSwitchover,  // batonctl promote: the standby takes over from a live primary
  kUpgrade,     // a canary that passed every step takes over from the old primary
  kPromotion,   // the first engine becomes primary (there was none)
};
inline constexpr PromotionKind kPromotionKinds[] = {
    PromotionKind::kFailover, PromotionKind::kDrain, PromotionKind::kSwitchover,
    PromotionKind::kUpgrade, PromotionKind::kPromotion};

// "failover", "drain", "switchover", "upgrade", "promotion".
const char* ToString(PromotionKind kind);
// The kind named `text`; InvalidArgument naming it when it names none.
Result<PromotionKind> ParsePromotionKind(std::string_view text);

struct PromotionRecord {
  uint64_t seq = 0;
  PromotionKind kind = PromotionKind::kFailover;
  std::string cause;  // e.g. "died: killed by SIGKILL", "hung: ...", "error: ..."
  uint64_t old_engine = 0;
  pid_t old_pid = 0;
  uint64_t new_engine = 0;
  uint64_t epoch = 0;        // the epoch the new primary serves at
  uint64_t fence_epoch = 0;  // the epoch the old primary was fenced at (0: not fenced yet)
  std::string outcome = "in progress";  // "serving", "down: no standby", ...
  bool complete = false;
  // False once the new primary serves beside a standby already there (a pair's first
  // promotion: both engines start together): no replacement standby is awaited.
  bool replacement_awaited = true;

  std::optional<TimePoint> requested, injected, last_heartbeat, detected, killed, epoch_durable,
      reaped, gpu_released, barrier_passed, promote_sent, promote_acked, kv_adopted,
      route_published, standby_launched, standby_ready;

  // Why the promotion waited for the old primary's barrier ("" when it did not: it started on
  // the promotion reserve), the old primary's blocks quarantined at its fence, and the
  // reserve the new primary started on.
  std::string waited;
  // The barrier's wait gave up after gpu.release_timeout_ms: a process of the old primary was
  // still alive or listed by NVML (each was sent SIGKILL and its blocks moved on).
  bool barrier_timed_out = false;
  uint32_t quarantined_blocks = 0;
  uint32_t reserve_blocks = 0;

  // How the new primary took the committed KV of the quarantined blocks (KvInherited).
  struct KvInheritance {
    proto::KvInheritMode mode = proto::KvInheritMode::kNone;
    uint32_t blocks = 0;
    uint64_t bytes = 0;
    double ms = 0;           // the copy, or the wait for the barrier
    double estimate_ms = 0;  // the copy as the engine estimated it
  };
  std::optional<KvInheritance> kv_inherited;

  // What the new primary adopted of the old one's KV (KV-warm failover), once it said.
  struct KvAdoption {
    uint32_t adopted = 0;                     // sequences
    uint64_t tokens = 0;                      // tokens not prefilled again
    std::map<std::string, uint32_t> dropped;  // reason -> sequences
    double read_ms = 0;                       // the engine's time to read the records
  };
  std::optional<KvAdoption> kv;
};

// Phase durations in milliseconds (absent when a phase has not happened).
struct PhaseTimes {
  std::optional<double> detect_ms, fence_ms, promote_ms, ready_ms, total_ms, teardown_ms;
};
PhaseTimes PhasesOf(const PromotionRecord& record);

class TimelineLog {
 public:
  explicit TimelineLog(const Clock& clock, size_t limit = 16);

  // Opens a record; the previous one, if still open, is closed as superseded.
  PromotionRecord& Open(PromotionKind kind, std::string cause);
  // The open record, or nullptr.
  PromotionRecord* current();
  // The most recent record (open or not), or nullptr.
  const PromotionRecord* last() const;
  // The most recent record that promoted `engine` at `epoch`, open or not; nullptr if none.
  PromotionRecord* Promoted(uint64_t engine, uint64_t epoch);
  // The most recent record that fenced `old_engine` at `fence_epoch`, open or not; nullptr if
  // none.
  PromotionRecord* Fenced(uint64_t old_engine, uint64_t fence_epoch);
  // The last record that is waiting for its replacement standby, or nullptr.
  PromotionRecord* awaiting_standby();
  void Close(std::string outcome);
  const std::deque<PromotionRecord>& records() const { return records_; }
  TimePoint Now() const { return clock_->Now(); }

  // One log line summarizing a record.
  static std::string Summary(const PromotionRecord& record);

 private:
  const Clock* clock_;
  size_t limit_;
  uint64_t next_seq_ = 1;
  bool open_ = false;
  std::deque<PromotionRecord> records_;
};

// JSON of one record: every stamp as milliseconds after the record's first stamp, the phase
// durations, and the wall-clock time of its first stamp (`now` is the steady clock's now).
nlohmann::json TimelineJson(const PromotionRecord& record, TimePoint now);
// "adopted 4 sequences (2400 tokens not prefilled again), dropped 0, records read in 0.3 ms".
std::string KvAdoptionText(const PromotionRecord::KvAdoption& kv);
// Whether Promote went out before the old primary's barrier passed: there was an old primary
// (a first promotion has no barrier), Promote did not wait for it, and was sent first (a
// standby still starting is promoted after a barrier it did not wait for).
bool PromotedBeforeBarrier(const PromotionRecord& record);
// "before the barrier, on a reserve of 16 blocks; 240 blocks quarantined until it passed",
// "after the barrier (the standby was not ready before it); 240 blocks quarantined", or
// "waited for the barrier (why); 240 blocks quarantined"; for a promotion that followed no
// primary (a pair's first), "no old primary: nothing was fenced or
// quarantined".
std::string PromotionText(const PromotionRecord& record);
// "copied", "waited", "none".
const char* ToString(proto::KvInheritMode mode);
// "copied 12 blocks (25165824 bytes) in 3.10 ms; a copy was estimated at 2.90 ms".
std::string InheritanceText(const PromotionRecord::KvInheritance& kv);
// A few lines, one per phase, for `batonctl timeline`.
std::string TimelineText(const PromotionRecord& record, TimePoint now);

// Wall-clock text ("2024-05-01T12:00:00.123Z") of a steady time point `t`, by its distance
// from `now`.
std::string WallTime(TimePoint t, TimePoint now);

}  // namespace baton
