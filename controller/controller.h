// Controller: the `baton-controller` daemon. It owns the model's weight cache and the
// KV-cache pool, launches and watches a primary and a standby engine, keeps the pool ledger
// and the epoch journal, fences and promotes per the fencing invariants, heals the pair by
// launching a new standby, publishes the route table and answers `batonctl`.
//
// Failover, in order (controller_failover.cc):
//   detect (pidfd readable, socket EOF, hang confirmed by a health probe, error report)
//   -> SIGKILL through the pidfd -> new epoch made durable (fsync) -> ledger fence
//   -> reap (waitid P_PIDFD; on the host backend the reap is the sync barrier)
//   -> quarantined blocks granted to the standby at the new epoch -> Promote sent
//   -> PromoteAck -> route table published -> replacement standby launched.
// No block is granted before its old holder is reaped (rule 2); every grant's epoch is
// durable before it is sent (rule 3); the standby maps nothing writable until Promote
// (rule 5); a stale epoch is refused, the sender told to stop and fenced (rule 4).
//
// Threads: everything runs on the one io_context thread given to Create(); the controller
// never blocks it except for the journal's fsync and the (short) reap of a killed child.
// Ownership: the controller owns every engine process (they die with it: PDEATHSIG), the
// weight cache, the pool memfd, the ledger, the journal, and every connection.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "controller/config.h"
#include "controller/core/crash_loop_guard.h"
#include "controller/core/epoch_journal.h"
#include "controller/core/pair_state.h"
#include "controller/core/pool_ledger.h"
#include "controller/engines/engine_record.h"
#include "controller/engines/supervisor.h"
#include "controller/promotion.h"
#include "controller/route_publisher.h"
#include "controller/upgrade/upgrade.h"
#include "cuda/device_owner.h"
#include "cuda/device_session.h"
#include "cuda/driver/gpu_backend.h"
#include "cuda/driver/nvml_library.h"
#include "proto/transport/listener.h"
#include "proto/transport/shared_memory.h"
#include "weightcache/weight_cache.h"

namespace baton {

// A message or connection the controller refused, kept for `batonctl status`.
struct Refusal {
  TimePoint at;
  std::string who;
  std::string reason;
};

// An engine that is gone, kept for `batonctl status`.
struct EngineExit {
  TimePoint at;
  EngineId id = 0;
  pid_t pid = 0;
  std::string launch_role;
  std::string cause;
  std::string exit;
};

class Controller {
 public:
  // Loads the weight cache, creates the pool, opens the journal and binds the socket.
  static Result<std::unique_ptr<Controller>> Create(boost::asio::io_context& io,
                                                    ControllerConfig config, Clock& clock);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Starts accepting connections and launches the engines.
  void Start();
  // Tells every engine to stop (Stop on its connection; SIGTERM if it has none), reaps each
  // as it exits, SIGKILLs and reaps those still alive after stop_grace, closes the socket and
  // calls `done`. A connection closing after Stop is the expected goodbye, not a failure: a
  // clean stop fences nothing and spends no epoch.
  void Shutdown(std::function<void()> done);

  // --- operator commands (batonctl) --------------------------------------------------------
  Status RequestSwitchover();
  Status RequestDrain();
  // kind: "kill" (SIGKILL the primary), "hang" (freeze its cgroup, else SIGSTOP its process
  // group), "error" (make it report one).
  Status Drill(const std::string& kind);
  // Starts a canary upgrade to `request.command` (controller_upgrade.cc; see upgrade.h):
  // needs a serving primary and a ready standby, and no upgrade in flight.
  Status RequestUpgrade(UpgradeRequest request);
  // During an upgrade: rolls its canary back (lossless: it drains). Otherwise: upgrades back
  // to the command that the last promoted upgrade replaced, by the same canary.
  // `overrides` may set the steps and limits, as for an upgrade (its command is ignored).
  Status RequestRollback(UpgradeRequest overrides = {});

  // --- views for status, timeline and metrics ------------------------------------------------
  const ControllerConfig& config() const { return config_; }
  const Clock& clock() const { return clock_; }
  const PairMachine& pair() const { return pair_; }
  const PoolLedger& ledger() const { return *ledger_; }
  const CrashLoopGuard& guard() const { return guard_; }
  const TimelineLog& timelines() const { return timelines_; }
  const std::map<EngineId, std::unique_ptr<EngineRecord>>& engines() const { return engines_; }
  const WeightCache& weights() const { return *weights_; }
  const SharedMemory& pool() const { return pool_; }
  // The CUDA backend's device memory; nullptr on the host backend.
  const DeviceOwner* device() const { return device_.get(); }
  bool cuda_backend() const { return cuda_backend_; }
  uint64_t device_losses() const { return device_losses_; }
  uint64_t device_rebuilds() const { return device_rebuilds_; }
  const std::string& device_lost_reason() const { return device_lost_reason_; }
  // Whether NVML listed the last engine that mapped device memory (nullopt: none checked yet);
  // once it has listed one, it stays true.
  std::optional<bool> nvml_lists_engines() const { return nvml_lists_engines_; }
  // Where engine cgroups are made; nullptr when fencing uses process groups only, for
  // `cgroups_off_reason()`.
  const EngineCgroups* cgroups() const { return cgroups_.get(); }
  const std::string& cgroups_off_reason() const { return cgroups_off_reason_; }
  // Reaped holders whose blocks wait for the barrier now.
  size_t barrier_waits() const { return barrier_waits_.size(); }
  const RoutePublisher& routes() const { return routes_; }
  uint64_t durable_epoch() const { return journal_->current(); }
  // The journal's reservation: the highest epoch that may ever have been handed out.
  uint64_t reserved_epoch() const { return journal_->reserved(); }
  const EpochJournal& journal() const { return *journal_; }
  // Reaped engines that still hold blocks because no epoch could be made durable to fence
  // them at; retried once a second.
  std::vector<EngineId> unfenced_reaped() const;
  EngineId primary() const { return primary_; }
  const std::deque<Refusal>& refusals() const { return refusals_; }
  const std::deque<EngineExit>& exits() const { return exits_; }
  const std::string& invariants() const { return invariants_; }
  uint64_t launches() const { return launches_; }
  uint64_t failovers() const { return failovers_; }
  uint64_t called_off_switchovers() const { return called_off_switchovers_; }
  const std::optional<Upgrade>& upgrade() const { return upgrade_; }
  const std::deque<UpgradeResult>& upgrade_history() const { return upgrade_history_; }
  // The engine command standbys are launched with now (the configured one until an upgrade
  // is promoted), and the one it replaced (empty: none).
  const std::vector<std::string>& active_command() const;
  const std::vector<std::string>& previous_command() const { return previous_command_; }
  uint64_t upgrades_promoted() const { return upgrades_promoted_; }
  uint64_t upgrades_rolled_back() const { return upgrades_rolled_back_; }
  uint64_t ticks() const { return ticks_; }
  uint64_t refusal_count() const { return refusal_count_; }
  // Bytes the clients' connections (batonctl, routers) hold unsent together.
  size_t client_send_queued_bytes() const {
    return client_send_budget_ != nullptr ? client_send_budget_->used() : 0;
  }
  TimePoint started_at() const { return started_at_; }
  bool backoff() const;

 private:
  Controller(boost::asio::io_context& io, ControllerConfig config, Clock& clock);
  Status Init();

  // controller.cc: connections.
  void Accept();
  void OnAccepted(proto::Channel channel);
  void OnFirstMessage(uint64_t conn, Result<proto::ReceivedMessage> msg);
  Status Admit(const proto::Hello& hello);
  void ReadCli(uint64_t conn);
  void Refused(const std::string& who, const std::string& reason);
  void ArmTick();
  void OnTick();
  void CloseIdleConnections();
  void StopEngine(EngineRecord& e);
  // Logs and records the exit of an engine during shutdown and erases its record.
  void OnStoppedExit(EngineRecord& e, const ExitInfo& exit, bool killed);
  void FinishShutdown();

  // controller_engines.cc: launching and engine messages.
  void MaybeLaunch();
  // When MaybeLaunch may next start an engine, if only time holds it back; nullopt when the
  // pair's state does (two live engines, a failover in flight, stopping, draining, no device
  // memory): the event that changes that state calls MaybeLaunch itself.
  std::optional<TimePoint> NextLaunchAt() const;
  void Launch(const std::string& role);
  int PickPort() const;
  void WatchPid(EngineId id);
  void AttachEngine(EngineId id, std::unique_ptr<proto::Channel> channel);
  void ReadEngine(EngineId id);
  void OnEngineMessage(EngineId id, const proto::ReceivedMessage& msg);
  void OnRegister(EngineRecord& e, const proto::ReceivedMessage& msg);
  void OnStandbyReady(EngineRecord& e, const proto::StandbyReady& msg);
  bool CheckEpoch(EngineRecord& e, uint64_t epoch, const char* what);
  void OnHeartbeat(EngineRecord& e, const proto::Heartbeat& msg);
  void OnLeaseRequest(EngineRecord& e, const proto::LeaseRequest& msg);
  void OnReturn(EngineRecord& e, const proto::ReturnExtents& msg);
  void RefuseEngine(EngineRecord& e, const Status& status);
  EngineRecord* Find(EngineId id);
  EngineRecord* FindByToken(const std::string& token);
  EngineRecord* Standby();  // a live engine in kStandby, preferring the lowest id
  size_t LiveEngines() const;

  // controller_failover.cc: failures, fences, promotions.
  void Fail(EngineId id, FailCause cause, const std::string& detail);
  void FailPrimary(EngineRecord& e, FailCause cause, TimePoint detected_at,
                   std::optional<TimePoint> killed_at);
  void FenceInLedger(EngineRecord& e);
  void OnProcessExit(EngineId id);
  void FinishFence(EngineRecord& e);
  bool BlocksAwaitBarrier() const;
  void MaybePromote();
  void SendPromote(EngineRecord& e, uint64_t epoch, const std::vector<Extent>& extents);
  void OnPromoteAck(EngineRecord& e, const proto::PromoteAck& msg);
  void OnDrained(EngineRecord& e, const proto::Drained& msg);
  // controller_upgrade.cc: the canary upgrade.
  // The command to launch engine `id` with; the candidate's launch marks it the canary.
  std::vector<std::string> CommandFor(EngineId id, const std::string& role);
  void SetPhase(Upgrade::Phase phase);
  void StartCanary(EngineRecord& e);
  void OnPrimaryReturned();
  void PromoteCanary();
  void OnCanaryPromoted(EngineRecord& e, uint64_t epoch);
  void TickUpgrade();
  void FinishUpgrade();
  void RollBackCanary(const std::string& reason);
  // The canary failed or was fenced: the upgrade is rolled back.
  void OnCanaryGone(EngineRecord& e);
  // The primary `old` failed or drained during an upgrade: a serving (or draining) canary
  // becomes the primary at once. False when there is none.
  bool CanaryTakesOver(EngineRecord& old);
  void EndUpgrade(const std::string& outcome, const std::string& reason);
  uint32_t CanaryTarget(uint32_t weight) const;
  uint32_t PrimaryKeeps() const;                // the least of the pool a primary keeps
  uint32_t WholeChunks(uint32_t blocks) const;  // rounded up to whole device pool chunks
  void ReclaimFromPrimary(uint32_t weight);
  void GrantFreeToCanary();
  void GiveFreeBlocksToPrimary();
  // After an upgrade: a standby still running the command it replaced (launched by a failover
  // during the upgrade) is stopped, so that the pair runs one version.
  void RetireStaleStandbys();
  // Start-up: the command a promoted upgrade put in place, if engine.command is unchanged.
  // <state_dir>/engine_command.json (controller/upgrade/command_record.h): the promoted command and
  // the upgrade in flight. Load runs once at start-up.
  void LoadCommands();
  void SaveCommands();
  bool IsCanary(EngineId id) const { return upgrade_.has_value() && upgrade_->canary == id; }

  // controller_ops.cc: the standby of a switch-over failed while the primary drained; the
  // primary serves again (Resume) if it speaks a protocol that can.
  void CallOffSwitchover(EngineRecord& standby);
  // Unavailable while `primary` has not answered a called-off drain: a new drain's deadline
  // would start while it still finishes the old one.
  Status CheckNoCalledOffDrain(const EngineRecord& primary) const;
  // Tells `e` to drain (a switch-over, a pair drain, an upgrade's either side): it takes no
  // new requests, has drain_timeout to finish, and is fenced if Drain cannot be sent.
  void DrainEngine(EngineRecord& e);
  // The timeline of a planned hand-over from `old` to `next` (switch-over, upgrade).
  PromotionRecord& OpenPlannedTimeline(const std::string& kind, const std::string& cause,
                                       const EngineRecord& old, EngineId next);
  // Grants `blocks` free blocks to holder `e` at its epoch and sends them (`who` for logs).
  void GrantFree(EngineRecord& e, uint32_t blocks, const char* who);
  void OnShareMemoryAck(EngineRecord& e, const proto::ShareMemoryAck& msg);
  Status SetUpDeviceMemory(const BackendChoice& backend, BackendMode mode);
  Result<std::unique_ptr<DeviceOwner>> MakeDeviceOwner() const;
  void CheckDevice();
  void RebuildDevice();
  void PollEngines();
  void PublishRoutes();
  void CheckInvariants();
  void ApplyPair(PairEvent event);
  Result<uint64_t> AdvanceEpoch();
  void ReplenishEpochs();
  // After each journal write: logs once when the journal can be written again.
  void NoteJournalState();

  boost::asio::io_context& io_;
  ControllerConfig config_;
  Clock& clock_;
  TimePoint started_at_;

  std::optional<EpochJournal> journal_;
  std::unique_ptr<PoolLedger> ledger_;
  std::optional<WeightCache> weights_;
  SharedMemory pool_;
  Mapping pool_map_;  // the controller's own mapping: pre-faults the pool at start-up
  std::unique_ptr<DeviceOwner> device_;  // CUDA backend: device weights and pool (null: lost)
  bool cuda_backend_ = false;
  DeviceOwnerOptions device_options_;
  TimePoint next_device_probe_{};
  uint64_t device_losses_ = 0;
  uint64_t device_rebuilds_ = 0;
  std::string device_lost_reason_;
  std::string rebuild_error_;          // the last reason a rebuild failed, logged once
  uint64_t rebuild_failures_ = 0;      // in a row: the rebuild's backoff
  std::unique_ptr<NvmlLibrary> nvml_;  // CUDA backend, where NVML loads: the barrier's check
  std::optional<proto::Listener> listener_;
  std::shared_ptr<proto::SendBudget> client_send_budget_;
  Supervisor supervisor_;
  // Declared before every holder of an EngineCgroup (engines, barrier waits): destroyed last.
  std::unique_ptr<EngineCgroups> cgroups_;
  std::string cgroups_off_reason_;
  // The engine's cgroup (null when cgroups are off), or why it could not be made.
  Result<std::shared_ptr<EngineCgroup>> MakeCgroup(EngineId id);
  // Every process of the engine that a fence must see gone: its process group's members and
  // its cgroup's, the leader included.
  std::vector<pid_t> EnginePids(const EngineRecord& e) const;
  PairMachine pair_;
  CrashLoopGuard guard_;
  TimelineLog timelines_;
  RoutePublisher routes_;
  boost::asio::steady_timer tick_;
  boost::asio::steady_timer accept_retry_;  // after a failed accept (out of fds): no spin
  std::optional<TimePoint> tick_at_;

  std::map<EngineId, std::unique_ptr<EngineRecord>> engines_;
  EngineId next_engine_id_ = 1;
  EngineId primary_ = kNoEngine;    // serving or draining
  EngineId promoting_ = kNoEngine;  // Promote sent, no PromoteAck yet
  // A fenced primary whose blocks go to `successor` once it is reaped.
  struct PendingFailover {
    EngineId old = kNoEngine;
    uint64_t epoch = 0;
    EngineId successor = kNoEngine;
  };
  std::optional<PendingFailover> failover_;
  // Reaped holders whose blocks wait for the rest of the barrier: the other processes of the
  // engine's process group (workers, or the engine under a wrapper script) to be gone, and on
  // the CUDA backend NVML to no longer list any of them on the GPU. Each one's hand-over runs
  // once it passes, or at the deadline ([gpu] release_timeout_ms).
  struct BarrierWait {
    EngineId old = kNoEngine;
    pid_t pid = 0;                         // the reaped leader; its process group id too
    std::vector<pid_t> group_pids;         // the group's members when it was fenced (CUDA backend)
    std::shared_ptr<EngineCgroup> cgroup;  // the engine's cgroup, or null
    std::optional<PendingFailover> failover;
    TimePoint deadline;
    bool still_listed = false;  // set when the wait ends: true if it ended by the timeout
  };
  std::map<EngineId, BarrierWait> barrier_waits_;  // by reaped engine
  // The fenced holder `old`'s blocks move on: to `failover`'s successor, or back to free.
  void HandOverBlocks(EngineId old, const std::optional<PendingFailover>& failover);
  // True when NVML lists any of `pids` on the GPU (false without NVML or on an NVML error).
  bool GpuStillLists(const std::vector<pid_t>& pids);
  // What still holds `w`'s barrier ("another process of its group lives on", "NVML still
  // lists it on GPU ..."), or "" once it has passed.
  std::string BarrierHeldBy(const BarrierWait& w);
  // Hands `wait.old`'s blocks on at once when nothing holds its barrier, else keeps the wait
  // (PollBarrierWaits ends it).
  void PassBarrierOrWait(BarrierWait wait);
  void PollBarrierWaits();
  // Reaped holders not fenced for want of a durable epoch, retried on ticks.
  struct UnfencedHolder {
    pid_t pid = 0;
    std::shared_ptr<EngineCgroup> cgroup;
  };
  std::map<EngineId, UnfencedHolder> unfenced_reaped_;
  std::optional<bool> nvml_lists_engines_;
  void CheckNvmlSeesEngine(const EngineRecord& e);
  TimePoint next_unfenced_retry_;
  void RetryUnfencedHolders();
  void FinishBarrierWait(const BarrierWait& g);
  struct DrillRecord {
    std::string kind;
    EngineId engine = kNoEngine;
    TimePoint at;
  };
  std::optional<DrillRecord> drill_;
  std::optional<Upgrade> upgrade_;
  std::deque<UpgradeResult> upgrade_history_;
  std::vector<std::string> active_command_;    // empty: config_.engine_command
  std::vector<std::string> previous_command_;  // what the last promoted upgrade replaced
  uint64_t upgrades_promoted_ = 0;
  uint64_t upgrades_rolled_back_ = 0;
  bool give_back_blocks_ = false;  // a canary is gone: free blocks return to the primary
  // The Reclaim sent to the primary and not answered yet: to whom, how many blocks, when.
  struct PendingReclaim {
    EngineId from = kNoEngine;
    uint32_t blocks = 0;
    TimePoint sent{};
  };
  PendingReclaim reclaim_;

  struct Connection {
    std::unique_ptr<proto::Channel> channel;
    TimePoint accepted_at;
    bool cli = false;
  };
  std::map<uint64_t, Connection> conns_;
  uint64_t next_conn_ = 1;

  std::deque<Refusal> refusals_;
  std::deque<EngineExit> exits_;
  std::string invariants_ = "ok";
  uint64_t launches_ = 0;
  uint64_t failovers_ = 0;
  uint64_t called_off_switchovers_ = 0;
  uint64_t ticks_ = 0;  // runs of OnTick
  uint64_t refusal_count_ = 0;
  bool stopping_ = false;
  bool replenish_failing_ = false;
  bool journal_failing_ = false;     // the latest journal write failed (NoteJournalState)
  TimePoint next_replenish_{};       // backoff while the journal cannot be written
  TimePoint next_promote_epoch_{};   // a promotion that found no epoch tries again then
  TimePoint relaunch_not_before_{};  // the replacement standby waits (standby_relaunch_delay)
  std::shared_ptr<boost::asio::steady_timer> stop_timer_;
  std::function<void()> stop_done_;
};

}  // namespace baton
