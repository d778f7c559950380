// EngineSession::Impl: the state and the heartbeat thread behind EngineSession.
//
// Connect() runs Handshake() (connect, Hello, Register, RegisterAck with the arena and pool
// fds, and the device regions' messages that follow it, taken off the channel but not
// mapped), StartThread(), TakeMemory() (read-only arena mapping, pool reservation, the device
// regions taken and acked), Prefault(), SendReady() and MarkRegistered() on the caller's
// thread. From StartThread() on the heartbeat thread (Run) owns the receiving side of the
// channel, so that the engine heartbeats while it maps and pre-faults however much memory: it
// sends a Heartbeat every interval, answers HealthRequest at once, maps promotion and grant
// extents, and queues events for the engine. The engine's threads (and TakeMemory's acks)
// send through the same channel under channel_mu_. The heartbeat thread holds the liveness
// page's robust mutex (proto/transport/liveness_page.h) from its start to its end; the page's
// fd goes with StandbyReady and with every Reattach, so that the controller sees this
// process die as soon as that thread leaves.
//
// Promotion and grant blocks are mapped in engine_session_blocks.cc. When the connection
// breaks (engine_session_reconnect.cc), the heartbeat thread drops the
// channel (sends then fail with Unavailable: "the controller is away"), pushes
// kControllerLost and reconnects with backoff. It makes the new connection and says Hello and
// Reattach on a channel of its own; only once the ReattachAck has arrived does it install that
// channel as channel_, and then it sends what changed between the Reattach and the install
// (CatchUp: blocks returned, PromoteAck, Drained, the ErrorReport of an engine that failed).
// Shutdown() interrupts a reconnect that waits for the controller's answer by shutting the
// socket of that connection down (handshake_fd_).
//
// Locks (annotated, base/thread_annotations.h): channel_mu_ guards channel_ and handshake_fd_;
// mu_ guards the pool mapping, the event queue and the session state (promoted_, serving_,
// drain_, stopped_, failed_, ...). When both are held, mu_ is taken first. Internal to the SDK.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/io/unique_fd.h"
#include "base/mutex.h"
#include "cuda/memory/vmm_share.h"
#include "proto/transport/channel.h"
#include "proto/transport/liveness_page.h"
#include "proto/transport/shared_memory.h"
#include "standby/sdk/engine_sdk.h"
#include "standby/sdk/pool_mapping.h"

namespace baton {

class EngineSession::Impl {
 public:
  explicit Impl(EngineSessionOptions options);
  ~Impl();

  // --- start-up, on the caller's thread ----------------------------------------------------
  // Handshake() and what it calls run before the heartbeat thread exists, so they use
  // channel_ and device_ without the locks; the analysis is off for them.
  Status Handshake() BATON_NO_THREAD_SAFETY_ANALYSIS;
  Status StartThread();
  Status TakeMemory();
  Status Prefault();
  // Maps the pool's header view and faults its pages in, a slice at a time (the session's
  // lock let go between slices); an engine without it reads headers with pread.
  void PrefaultHeaderView();
  Status SendReady() BATON_EXCLUDES(channel_mu_);
  // The liveness page's fd, to go with StandbyReady and Reattach; empty without a page.
  std::vector<int> LivenessFds() const;
  // StandbyReady has gone (at the end of Connect(), or with ready_when_waiting at the first
  // WaitForPromotion()): from now on a lost connection is reconnected (if protocol 5).
  void MarkRegistered() { registered_.store(true); }
  // With ready_when_waiting: sends StandbyReady once, the first time it is called, and marks
  // the session registered; OK at once after that.
  Status SendDeferredReady() BATON_EXCLUDES(channel_mu_, mu_);

  // --- the public API ------------------------------------------------------------------------
  uint64_t engine_id() const { return options_.launch.engine_id; }
  const MappedWeights& weights() const { return weights_; }
  const PoolView& pool() const { return pool_view_; }
  // Copies, under mu_ (Shutdown() drops the device session).
  std::optional<DeviceRegionView> device_weights() const;
  std::optional<DeviceRegionView> device_pool() const;
  uint64_t declined_pool_chunk_bytes() const { return declined_pool_chunk_bytes_; }
  Result<SessionEvent> WaitForPromotion(std::optional<Duration> timeout);
  Status MarkServing();
  std::optional<SessionEvent> NextEvent(std::optional<Duration> timeout);
  Status RequestBlocks(uint32_t blocks);
  Status ReturnBlocks(std::span<const MappedExtent> extents);
  Status ReportDrained(uint32_t unfinished);
  Status ReportKvAdoption(const KvAdoptionSummary& summary);
  Result<SessionEvent> WaitForInheritedBlocks(Duration timeout);
  Result<std::vector<MappedExtent>> MapQuarantined();
  Status MapQuarantined(std::span<const uint32_t> blocks);
  void ReleaseQuarantined();
  Status ReportKvInheritance(const KvInheritanceSummary& summary);
  Status ReportError(const Status& error);
  uint64_t epoch() const { return epoch_.load(); }
  bool resume_pending() const { return resume_pending_.load(); }
  Status CheckEpoch() const;
  std::vector<MappedExtent> extents() const;
  uint64_t heartbeats_sent() const { return heartbeat_seq_.load(); }
  // For the registration's log line: how long the header view took, or that there is none.
  std::string HeaderViewText() const {
    if (header_view_ms_ < 0) return " (no header view)";
    char ms[32];
    std::snprintf(ms, sizeof(ms), "%.3f", header_view_ms_);
    return std::string(", its header view pre-faulted in ") + ms + " ms";
  }
  void ReportProgress(uint64_t steps_done, uint32_t work_pending) {
    progress_steps_.store(steps_done, std::memory_order_relaxed);
    progress_pending_.store(work_pending, std::memory_order_relaxed);
    if (!progress_reported_.load(std::memory_order_relaxed)) progress_reported_.store(true);
  }
  uint64_t progress_sent() const { return progress_sent_.load(); }
  void SetControllerAbsence(Duration timeout, ControllerAbsentAction action);
  void Shutdown();

 private:
  // Where the session stands with a drain, for the role a Reattach reports.
  enum class DrainState { kNone, kDraining, kDrained };
  // The (st_dev, st_ino) of a memfd: which memory this engine maps.
  struct FileIdentity {
    uint64_t dev = 0;
    uint64_t ino = 0;
  };
  // What a Reattach told the controller; compared after the ack (CatchUp).
  struct Reported {
    proto::ReattachRole role = proto::ReattachRole::kStandby;
    std::vector<proto::BlockRange> extents;
  };
  // One reconnect attempt's outcome: attached again, refused (the session ends as told to
  // stop), or failed (try again after the backoff).
  enum class AttemptOutcome { kAttached, kRefused, kFailed };
  struct Attempt {
    AttemptOutcome outcome = AttemptOutcome::kFailed;
    std::string reason;
  };
  class HandshakeWatch;  // RAII: lets Shutdown() interrupt a reconnect's handshake

  static Result<FileIdentity> IdentityOf(int fd);
  proto::ChannelOptions ChannelOptionsForController() const;
  Status ReceiveRegisterAck() BATON_NO_THREAD_SAFETY_ANALYSIS;
  Status MapWeights(const proto::RegisterAck& ack, UniqueFd arena_fd, UniqueFd second_fd);
  Status ReservePool(const proto::RegisterAck& ack, UniqueFd pool_fd);
  Status TakeDeviceRegions(const proto::RegisterAck& ack, std::vector<ReceivedVmmRegion> regions);
  // Maps (or unmaps) blocks in the host pool and, with device memory, the device pool.
  // `inherited`, when given, gets each block's header as it was before the scrub.
  Status MapBlocksLocked(uint32_t first, uint32_t count, std::vector<uint8_t>* inherited = nullptr)
      BATON_REQUIRES(mu_);
  Status UnmapBlocksLocked(uint32_t first, uint32_t count) BATON_REQUIRES(mu_);

  // `fds` go with the message (SCM_RIGHTS).
  template <typename T>
  Status Send(const T& msg, std::span<const int> fds = {}) BATON_EXCLUDES(channel_mu_) {
    MutexLock lock(channel_mu_);
    if (!channel_.has_value()) {
      return Unavailable(stopping_.load() ? "the session is shut down"
                                          : "no connection to the controller (it is away)");
    }
    return channel_->Send(msg, fds);
  }
  // Send() for a message whose content a Reattach also carries (the role, the mapped
  // extents): when it cannot go because the connection is gone and the session will
  // reattach, OK (the next Reattach says it).
  template <typename T>
  Status SendOrDefer(const T& msg) {
    Status sent = Send(msg);
    if (sent.ok() || !ConnectionGone() || !CanReattach()) return sent;
    return OkStatus();
  }
  bool ConnectionGone() BATON_EXCLUDES(channel_mu_);
  bool CanReattach() const BATON_EXCLUDES(mu_);
  proto::ReattachRole RoleLocked() const BATON_REQUIRES(mu_);

  // Heartbeat thread (engine_session_reconnect.cc: Run and the reconnect).
  void Run();
  // Serves the current connection until it breaks (the reason) or the session stops (OK).
  Status ServeAttached();
  Status PumpMessages();  // an error once the connection is gone
  void SendHeartbeat();
  // Sends a heartbeat when the last one is an interval old: a mapping on the heartbeat thread
  // (a promotion's or a grant's blocks, however many) must not read as a hang. Any thread.
  void BeatIfDue();
  void Handle(const proto::ReceivedMessage& msg);
  void OnPromote(const proto::Promote& msg);
  // Puts the quarantined blocks of a Quarantined that came with this Promote into `event`,
  // with their headers read from the host pool's file (on a device pool too), unmapped.
  void ReadQuarantinedLocked(uint64_t epoch, SessionEvent* event) BATON_REQUIRES(mu_);
  // A Quarantined before a Promote is kept for it; one with no extents at the epoch of the
  // promotion, after it, says the quarantined blocks will not come (a restarted controller
  // could not account for them): a wait for them ends.
  void OnQuarantined(proto::Quarantined msg) BATON_EXCLUDES(mu_);
  // Maps quarantined blocks [first, first + count) read-only unless they are already.
  Status MapQuarantinedRunLocked(uint32_t first, uint32_t count) BATON_REQUIRES(mu_);
  void OnGrant(const proto::Grant& msg);
  // A Drain (`successor`: a next primary follows) or a FinalDrain: the kDrain event.
  void OnDrain(uint64_t epoch, uint32_t timeout_ms, bool successor) BATON_EXCLUDES(mu_);
  void OnStop(const std::string& reason);
  void OnDisconnected(const std::string& reason);
  void SetDrain(DrainState state) BATON_EXCLUDES(mu_);
  void OnControllerLost(const std::string& reason);
  // Reconnects until attached again (true) or the session ends (false: shut down, refused,
  // or given up by on_controller_absent). The controller went away at `lost_at`.
  bool AwaitController(TimePoint lost_at);
  // Whether the absence since `lost_at` ends the session; logs the decision once.
  bool GiveUpAfterAbsence(TimePoint lost_at, bool* logged);
  // One attempt: connect, Hello, Reattach, the answer; installs the channel once attached.
  Attempt TryReattach();
  Attempt SayReattach(proto::Channel& channel, Reported* reported, proto::ReattachAck* ack);
  // The Reattach for what this engine holds now, which `reported` records.
  proto::Reattach ReattachMessage(Reported* reported) const BATON_EXCLUDES(mu_);
  Attempt ReadReattachAnswer(proto::Channel& channel, proto::ReattachAck* ack);
  // Sends what changed between the Reattach and the install of its channel.
  void CatchUp(const Reported& reported);
  // Waits `d` (real time) or until Shutdown(); false on shutdown.
  bool WaitBackoff(Duration d);
  // Maps and scrubs `ranges`; on failure unmaps what it mapped.
  Result<std::vector<MappedExtent>> MapRangesLocked(const std::vector<proto::BlockRange>& ranges,
                                                    std::vector<uint8_t>* inherited = nullptr)
      BATON_REQUIRES(mu_);
  void Push(SessionEvent event) BATON_EXCLUDES(mu_);
  void Refuse(const Status& status);
  MappedExtent ExtentOf(uint32_t first, uint32_t count) const BATON_REQUIRES(mu_);

  EngineSessionOptions options_;
  Clock* clock_;
  boost::asio::io_context io_;  // owns the socket's service; never run

  Mutex channel_mu_;
  std::optional<proto::Channel> channel_ BATON_GUARDED_BY(channel_mu_);

  // What the RegisterAck brought, from Handshake() to TakeMemory().
  struct PendingMemory {
    proto::RegisterAck ack;
    UniqueFd arena_fd;
    UniqueFd arena_second_fd;  // a partial arena's 4 KiB part; invalid otherwise
    UniqueFd pool_fd;
    std::vector<ReceivedVmmRegion> device_regions;
  };
  // MADV_POPULATE_READ calls cover at most this much (Prefault): the longest the mmap lock is
  // held at once, about 15 ms at 2 GB/s.
  static constexpr size_t kPrefaultSliceBytes = 32u << 20;

  std::optional<PendingMemory> pending_;
  SharedMemory arena_;
  SharedMemory arena_second_;  // a partial arena's 4 KiB part, mapped right after arena_
  Mapping arena_map_;
  MappedWeights weights_;
  PoolView pool_view_;
  Duration heartbeat_interval_ = std::chrono::milliseconds(100);  // the heartbeat thread's
  uint8_t touched_ = 0;         // keeps the pre-fault reads from being optimized away
  double header_view_ms_ = -1;  // PrefaultHeaderView's time; < 0: no view

  FileIdentity arena_id_;  // set by Handshake()
  FileIdentity pool_id_;
  int handshake_fd_ BATON_GUARDED_BY(channel_mu_) = -1;  // the socket of a reconnect in progress

  mutable Mutex mu_ BATON_ACQUIRED_BEFORE(channel_mu_);
  CondVar cv_;
  PoolMapping pool_ BATON_GUARDED_BY(mu_);
  std::unique_ptr<DeviceSession> device_ BATON_GUARDED_BY(mu_);  // set before the thread starts
  uint64_t declined_pool_chunk_bytes_ = 0;  // the device pool's chunk, when declined
  std::deque<SessionEvent> events_ BATON_GUARDED_BY(mu_);
  bool promoted_ BATON_GUARDED_BY(mu_) = false;
  // The kPromoted event was taken (WaitForPromotion, NextEvent): a later wait fails at once.
  bool promotion_taken_ BATON_GUARDED_BY(mu_) = false;
  // The Quarantined that precedes a Promote, until the Promote comes.
  std::optional<proto::Quarantined> quarantined_ BATON_GUARDED_BY(mu_);
  // The quarantined ranges of the promotion whose headers were read (MapQuarantined maps
  // these), until ReleaseQuarantined.
  std::vector<proto::BlockRange> quarantined_ranges_ BATON_GUARDED_BY(mu_);
  bool serving_ BATON_GUARDED_BY(mu_) = false;  // MarkServing() was called
  // WaitForInheritedBlocks() was called: a Grant is mapped at once (OnGrant).
  bool inherit_waiting_ BATON_GUARDED_BY(mu_) = false;
  // An empty Quarantined at the promotion's epoch came after it: the quarantined blocks will
  // not be granted (OnQuarantined); a wait for them ends.
  bool inherit_abandoned_ BATON_GUARDED_BY(mu_) = false;
  DrainState drain_ BATON_GUARDED_BY(mu_) = DrainState::kNone;
  uint32_t drains_unanswered_ BATON_GUARDED_BY(mu_) = 0;   // Drains not yet ReportDrained()
  uint32_t drained_unfinished_ BATON_GUARDED_BY(mu_) = 0;  // what ReportDrained() said
  std::atomic<uint16_t> protocol_{0};                      // the version the last Hello agreed on
  // The error reported, sent again after a reattach.
  std::optional<proto::ErrorReport> error_ BATON_GUARDED_BY(mu_);
  std::optional<std::string> stopped_ BATON_GUARDED_BY(mu_);  // why, once told to stop
  // Why, once an error was reported or a promotion failed.
  std::optional<std::string> failed_ BATON_GUARDED_BY(mu_);
  // Why, once the session ended without a controller.
  std::optional<std::string> disconnected_ BATON_GUARDED_BY(mu_);

  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> heartbeat_seq_{0};
  // ReportProgress(): sent with each heartbeat once reported (SendHeartbeat).
  std::atomic<uint64_t> progress_steps_{0};
  std::atomic<uint32_t> progress_pending_{0};
  std::atomic<bool> progress_reported_{false};
  std::atomic<uint64_t> progress_sent_{0};
  std::atomic<int64_t> next_beat_ns_{0};  // the clock's nanoseconds when a heartbeat is due
  std::atomic<int64_t> beat_every_ns_{100'000'000};  // heartbeat_interval_, for any thread
  std::atomic<bool> stopping_{false};
  std::atomic<bool> resume_pending_{false};
  std::atomic<bool> registered_{false};
  std::atomic<bool> ready_sent_{false};  // StandbyReady sent (ready_when_waiting)
  std::atomic<int64_t> absent_timeout_ns_{0};
  std::atomic<ControllerAbsentAction> absent_action_{ControllerAbsentAction::kServe};
  UniqueFd wake_fd_;  // eventfd: wakes the heartbeat thread for shutdown
  // Held by the heartbeat thread; invalid when it could not be made (the controller then
  // sees this engine's death by its connection's end alone).
  proto::LivenessPage liveness_;
  std::thread thread_;
};

}  // namespace baton
