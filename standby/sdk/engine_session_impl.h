// EngineSession::Impl: the state and the heartbeat thread behind EngineSession.
//
// Connect() runs Handshake() (connect, Hello, Register, RegisterAck with the arena and pool
// fds, read-only arena mapping, pool reservation), StartThread(), Prefault() and SendReady()
// on the caller's thread. From then on the heartbeat thread (Run) owns the receiving side of
// the channel: it sends a Heartbeat every interval, answers HealthRequest at once, maps
// promotion and grant extents, and queues events for the engine. The engine's threads send
// through the same channel under channel_mu_.
//
// Locks: channel_mu_ guards channel_; mu_ guards the pool mapping, the event queue and the
// session state. When both are held, mu_ is taken first. Internal to the SDK.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "base/io/unique_fd.h"
#include "proto/transport/channel.h"
#include "proto/transport/shared_memory.h"
#include "standby/sdk/engine_sdk.h"
#include "standby/sdk/pool_mapping.h"

namespace baton {

class EngineSession::Impl {
 public:
  explicit Impl(EngineSessionOptions options);
  ~Impl();

  // --- start-up, on the caller's thread ----------------------------------------------------
  Status Handshake();
  Status StartThread();
  Status Prefault();
  Status SendReady();

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
  Status ReportError(const Status& error);
  uint64_t epoch() const { return epoch_.load(); }
  bool resume_pending() const { return resume_pending_.load(); }
  Status CheckEpoch() const;
  std::vector<MappedExtent> extents() const;
  uint64_t heartbeats_sent() const { return heartbeat_seq_.load(); }
  void Shutdown();

 private:
  Status ReceiveRegisterAck();
  Status MapWeights(const proto::RegisterAck& ack, UniqueFd arena_fd);
  Status ReservePool(const proto::RegisterAck& ack, UniqueFd pool_fd);
  Status TakeDeviceRegions(const proto::RegisterAck& ack);
  // Maps (or unmaps) blocks in the host pool and, with device memory, the device pool.
  // Caller holds mu_.
  Status MapBlocksLocked(uint32_t first, uint32_t count);
  Status UnmapBlocksLocked(uint32_t first, uint32_t count);

  template <typename T>
  Status Send(const T& msg) {
    std::lock_guard<std::mutex> lock(channel_mu_);
    if (!channel_.has_value()) return Unavailable("the session is shut down");
    return channel_->Send(msg);
  }

  // Heartbeat thread.
  void Run();
  bool PumpMessages();  // false once the connection is gone
  void SendHeartbeat();
  void Handle(const proto::ReceivedMessage& msg);
  void OnPromote(const proto::Promote& msg);
  void OnGrant(const proto::Grant& msg);
  void OnStop(const std::string& reason);
  void OnDisconnected(const std::string& reason);
  // Maps and scrubs `ranges`; on failure unmaps what it mapped. Caller holds mu_.
  Result<std::vector<MappedExtent>> MapRangesLocked(const std::vector<proto::BlockRange>& ranges);
  void Push(SessionEvent event);
  void Refuse(const Status& status);
  MappedExtent ExtentOf(uint32_t first, uint32_t count) const;

  EngineSessionOptions options_;
  Clock* clock_;
  boost::asio::io_context io_;  // owns the socket's service; never run

  std::mutex channel_mu_;
  std::optional<proto::Channel> channel_;

  SharedMemory arena_;
  Mapping arena_map_;
  MappedWeights weights_;
  PoolView pool_view_;
  Duration heartbeat_interval_ = std::chrono::milliseconds(100);
  uint8_t touched_ = 0;  // keeps the pre-fault reads from being optimized away

  mutable std::mutex mu_;
  std::condition_variable cv_;
  PoolMapping pool_;
  std::unique_ptr<DeviceSession> device_;   // set before the thread starts
  uint64_t declined_pool_chunk_bytes_ = 0;  // the device pool's chunk, when declined
  std::deque<SessionEvent> events_;
  bool promoted_ = false;
  std::string stopped_;       // non-empty once told to stop
  std::string failed_;        // non-empty once an error was reported or a promotion failed
  std::string disconnected_;  // non-empty once the connection is gone

  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> heartbeat_seq_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> resume_pending_{false};
  UniqueFd wake_fd_;  // eventfd: wakes the heartbeat thread for shutdown
  std::thread thread_;
};

}  // namespace baton
