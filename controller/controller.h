// Controller: the `baton-controller` daemon around the Coordinator. The Coordinator
// (controller/core/coordinator.h) makes every decision; the daemon owns what it decides about
// and carries its decisions out (it is the Coordinator's Effects):
//   * the memory: the weight cache, the pool memfd and, on the CUDA backend, the device
//     memory (controller_memory.cc, controller_device_keep.cc), kept by baton-keeper so that
//     a restarted controller adopts them instead of loading the model again;
//   * the engine processes (pidfds, cgroups, launch, kill, the barrier's checks) and their
//     control channels (controller_effects.cc);
//   * the epoch journal, the roster and the command record on disk;
//   * the listening socket: engines, routers (the route table) and batonctl;
//   * one timer, armed for the Coordinator's next deadline.
// It turns sockets, pidfds and the timer into Coordinator events.
//
// Start-up (Create): directories, cgroups, the backend, the journal, the command record, the
// previous controller's roster (its engines found alive or gone), the weights and the pool
// (adopted from baton-keeper when they are proven to be the configured model and complete,
// else loaded afresh), the socket. Start() then hands the Coordinator what was found.
//
// Threads: everything runs on the one io_context thread given to Create(); the controller
// never blocks it except for the journal's fsync and short reaps. Engines, the weights and
// the pool outlive the controller: only Shutdown() (SIGTERM, Ctrl-C) stops the engines.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "controller/config.h"
#include "controller/controller_status.h"
#include "controller/core/coordinator.h"
#include "controller/core/effects.h"
#include "controller/engines/engine_handle.h"
#include "controller/engines/engine_key_file.h"
#include "controller/engines/engine_logs.h"
#include "controller/engines/peer_origin.h"
#include "controller/engines/supervisor.h"
#include "controller/epoch_journal.h"
#include "controller/fleet_member.h"
#include "controller/fleet_reports.h"
#include "controller/keeper/keeper_client.h"
#include "controller/keeper/keeper_watch.h"
#include "controller/kept_memory.h"
#include "controller/rollout/coordinator_upgrades.h"
#include "controller/rollout/fleet_rollout.h"
#include "controller/roster_file.h"
#include "controller/route_publisher.h"
#include "cuda/device_owner.h"
#include "cuda/driver/gpu_backend.h"
#include "cuda/driver/nvml_library.h"
#include "proto/transport/listener.h"
#include "proto/transport/shared_memory.h"
#include "weightcache/weight_cache.h"

namespace baton {

class Controller final : private Effects {
 public:
  // Opens everything (see above) and binds the socket; nothing is launched yet.
  static Result<std::unique_ptr<Controller>> Create(boost::asio::io_context& io,
                                                    ControllerConfig config, Clock& clock);
  ~Controller() override;
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Starts accepting connections and gives the Coordinator what start-up found: it launches
  // the pair, or waits for the previous controller's engines to register again.
  void Start();
  // Tells every engine to stop (Stop on its connection; SIGTERM if it has none), waits for
  // each to exit, SIGKILLs those still alive after stop_grace, lets baton-keeper drop the
  // memory, closes the socket and calls `done`. A clean stop fences nothing and spends no
  // epoch.
  void Shutdown(std::function<void()> done);
  // `batonctl controller restart`: the process exits now (status 0) and leaves its engines,
  // the weights and the pool to the controller the service manager starts next, as a crash
  // would, without the crash.
  [[noreturn]] void HandOver(const std::string& why);
  // HandOver once the current reply has gone out.
  void ScheduleHandOver(const std::string& why);

  Coordinator& coordinator() { return *coord_; }
  const ControllerConfig& config() const { return config_; }
  // Everything status and metrics show, as one copy.
  ControllerStatus Snapshot() const;

 private:
  Controller(boost::asio::io_context& io, ControllerConfig config, Clock& clock);
  Status Init();
  // Reads [engine] key_file (EngineKeyFile::Load), or warns of engines open to the network.
  Status LoadEngineKeys();

  // controller_memory.cc: the weights, the pool and the device memory.
  Status SetUpMemory(const BackendChoice& backend, BackendMode mode);
  std::optional<KeeperClient> ConnectKeeper();
  // The record of what baton-keeper keeps (none without a keeper, or when it does not load).
  std::optional<MemoryRecord> LoadKeptRecord(bool keeper) const;
  // At a start with no roster: the kept memory's unaccounted holders killed
  // (ClearHoldersOfKeptMemory); why the kept pool cannot be adopted ("": it can).
  std::string WhyKeptPoolIsUnsafe(const BackendChoice& backend, bool weights_adopted,
                                  bool pool_adopted);
  // The device memory over the host memory just set up; where it cannot be made over adopted
  // weights, the weights are loaded afresh and it is made as at a first start. Returns why
  // the weights were not adopted (`weights_why`, or that reload's reason).
  Result<std::string> SetUpDeviceOverHost(const BackendChoice& backend, BackendMode mode,
                                          KeeperClient* keeper, const std::string& weights_why,
                                          bool pool_adopted);
  // found_.blocks_per_chunk for a device pool (mapped by whole chunks), logged when rounded.
  void NoteDeviceChunks();
  // Each takes what baton-keeper kept, when `record` proves it; returns why not ("": adopted).
  // With `files_may_differ` the weights are taken whatever the model files are now.
  std::string AdoptWeights(std::optional<KeeperClient>& keeper,
                           const std::optional<MemoryRecord>& record,
                           bool files_may_differ = false);
  // The weights: adopted, else loaded; when changed model files do not load, the kept
  // weights serve on (weights_files_ says why). Returns why they were not adopted.
  Result<std::string> SetUpWeights(std::optional<KeeperClient>& keeper,
                                   const std::optional<MemoryRecord>& record);
  std::string AdoptPool(std::optional<KeeperClient>& keeper,
                        const std::optional<MemoryRecord>& record);
  // Gives baton-keeper what was made afresh and writes the record of what it keeps.
  void KeepMemory(KeeperClient& keeper, bool weights_adopted, bool pool_adopted,
                  MemoryRecord* record);
  void NoteMemoryIdentity(const std::string& weights_why, const std::string& pool_why);
  // At a clean stop: baton-keeper lets everything go, and the record goes.
  // Asks baton-keeper to let the memory go; false when it did not (the caller kills it).
  bool ReleaseKeptMemory();
  Status LoadWeights();
  Status MakePool();
  // `keeper`: where the device memory is kept (null: not kept); `host_adopted`: the weights
  // and the pool are the previous controller's, so its device memory may be adopted too.
  Status SetUpDeviceMemory(const BackendChoice& backend, BackendMode mode, KeeperClient* keeper,
                           bool host_adopted);
  Result<std::unique_ptr<DeviceOwner>> MakeDeviceOwner() const;
  // controller_device_keep.cc: the device memory that baton-keeper keeps.
  // The device memory memory_record_ names, proven and imported; the reason when refused.
  Result<std::unique_ptr<DeviceOwner>> AdoptDevice(KeeperClient& keeper);
  // Gives baton-keeper device_'s chunks (in parts) and its manifest, and records them.
  void KeepDevice(KeeperClient& keeper);
  // Lets baton-keeper close every kept device item (before device memory is made anew: a
  // GPU has no room for two copies) and records that none is kept.
  void ForgetKeptDevice(KeeperClient& keeper);
  // A connection to a running keeper (none is started), or nullopt when memory is not kept.
  std::optional<KeeperClient> RunningKeeper();
  void SaveRecord();
  // controller_keeper.cc: baton-keeper's death (keeper_watch.h). Watches the keeper that
  // start-up handed the memory to.
  void StartKeeperWatch();
  // Keeps the memory in a new keeper (new generations, the record rewritten).
  Status HandMemoryTo(KeeperClient& keeper);
  // controller_start.cc: what the previous controller left.
  void FindPrevious();
  // A start that failed after FindPrevious: the previous controller's engines that still run
  // are left running (not killed: they serve on, and the next controller re-adopts them), and
  // a baton-keeper that keeps nothing is let go.
  void LeaveAsFound(const Status& why);
  // Started without a roster (refused, or none), nothing says which processes hold the memory
  // baton-keeper kept: every process but this one and the keeper that maps or holds open the
  // adopted weight arena (`weights`) or pool (`pool`) is an engine of a previous controller,
  // or one of its workers, and is killed (its process group too, when it leads one) and
  // awaited before anything is adopted. Returns why the pool cannot be adopted ("": it can):
  // a holder that could not be killed or did not exit within kHolderExitWait.
  std::string ClearHoldersOfKeptMemory(bool weights, bool pool);
  // With [fleet]: reads the fleet routers' reports from etcd into routes_ (fleet_reports.h).
  Status StartFleetReports();
  // With [fleet]: this node's part in fleet-wide upgrades (rollout/fleet_rollout.h).
  Status StartFleetRollout();
  void AdoptHandle(const RosterEngine& r);

  // controller.cc: connections and the timer.
  // Accepts the next connection on controller.sock, or on the router socket.
  void Accept(bool routers_only);
  void OnAccepted(proto::Channel channel, bool routers_only);
  void OnFirstMessage(uint64_t conn, Result<proto::ReceivedMessage> msg);
  // Who is behind a connection that says Hello.
  struct Peer {
    pid_t pid = 0;              // SO_PEERCRED: the process that connected
    int pidfd = -1;             // SO_PEERPIDFD of it, -1 without one (owned by the caller)
    bool routers_only = false;  // accepted on the router socket
  };
  // Whether the controller serves `hello` from `peer`.
  Status Admit(const proto::Hello& hello, const Peer& peer);
  // Binds [controller] router_socket (mode 0660) and logs its owner.
  Status BindRouterSocket(const proto::ChannelOptions& options);
  void ReadCli(uint64_t conn);
  // Sends `reply` to the batonctl on `conn` (if it is still there) and reads its next request.
  void AnswerCli(uint64_t conn, const proto::CtlReply& reply);
  void CloseIdleConnections();
  void ArmTick();
  // A router's EngineStalled, from its socket or a fleet router's report in etcd
  // (FleetReportReader): fenced as hung unless a router saw it answer a request since.
  void OnEngineStalled(const proto::EngineStalled& s);
  void OnTick();
  // With [fleet]: every FleetMember::kLoadInterval, the pool's use into the node's record.
  void ArmFleetLoad();
  // While cgroups of gone engines wait for their members to exit: sweeps them every 10 ms.
  void ArmCgroupSweep();
  NodeFacts FleetFacts() const;
  // The pool's use now, for the node's record.
  NodeLoad FleetLoad() const;
  void FinishShutdown();
  // controller_engines.cc: engine channels and pidfds.
  void AttachEngine(EngineId id, std::unique_ptr<proto::Channel> channel);
  void ReadEngine(EngineId id);
  void OnEngineMessage(EngineId id, const proto::ReceivedMessage& msg);
  void WatchPid(EngineId id);
  void OnPidReadable(EngineId id);
  // How engine `h` ended, for the Coordinator: `exit` with its log's last line and, after a
  // crash (Crashed), where its log is kept.
  std::string ExitWords(const EngineHandle& h, const ExitInfo& exit);
  bool Crashed(EngineId id) const;
  // The liveness page that came with StandbyReady or Reattach (its one fd), watched; its
  // owner's death posts OnEngineDying.
  void WatchLiveness(EngineId id, proto::ReceivedMessage& msg);
  // Waits (by posting itself again, `deferred` times so far) while what the engine sent
  // before it died is still unread, so that it is handled before the fence.
  void OnEngineDying(EngineId id, pid_t pid, int deferred = 0);
  void CheckNvmlSeesEngine(EngineHandle& h);
  EngineHandle* Handle(EngineId id);
  // Every engine's processes as EngineOwning (engines/peer_origin.h) looks for them.
  std::vector<EngineProcesses> EngineProcessList() const;
  // An engine's Hello (`token_engine`: the engine its token names) must come from a process
  // of that engine, any other role's from a process of no engine; FailedPrecondition naming
  // the process and the engine otherwise.
  // A connection whose process is gone (ConnectedProcessGone) is served in no role.
  Status CheckPeerOrigin(const proto::Hello& hello, EngineId token_engine, const Peer& peer) const;
  // Every process of the engine that a fence must see gone: its process group's members and
  // its cgroup's, the leader included.
  std::vector<pid_t> EnginePids(const EngineHandle& h) const;
  bool GpuStillLists(const std::vector<pid_t>& pids);

  // Effects (controller_effects.cc).
  Result<std::string> NewToken() override;
  Result<pid_t> Launch(const LaunchSpec& spec) override;
  Status CheckCommand(const std::vector<std::string>& command) override {
    return supervisor_.CheckCommand(command);
  }
  bool Kill(EngineId id) override;
  bool Dying(EngineId id) override;
  void Terminate(EngineId id) override;
  Result<std::string> Drill(EngineId id, DrillKind kind) override;
  std::string BarrierHeldBy(EngineId id) override;
  void Release(EngineId id) override;
  Status Send(EngineId id, const ToEngine& message) override;
  void Disconnect(EngineId id) override;
  bool PublishRoutes(proto::RouteTable table) override;
  std::map<uint64_t, proto::EngineOutcome> RouterOutcomes() const override;
  size_t RouterCount() const override;
  Status SaveRoster(const Roster& roster) override;
  Status SaveCommandRecord(const CommandRecord& record) override;
  bool DeviceMemoryPresent() const override;
  Status ProbeDevice() override;
  void DropDevice() override;
  Status RebuildDevice() override;
  Status SendRegisterAck(EngineHandle& h);

  boost::asio::io_context& io_;
  ControllerConfig config_;
  Clock& clock_;
  TimePoint started_at_;
  // One controller per runtime directory (config_.lock_path()), taken before anything there
  // is touched; released last, after the engines' cgroups are gone.
  UniqueFd runtime_lock_;
  StartState found_;  // what start-up found, handed to the Coordinator by Start()
  RosterFile roster_file_;

  std::optional<EpochJournal> journal_;
  std::optional<WeightCache> weights_;
  SharedMemory pool_;
  Mapping pool_map_;  // the controller's own mapping: pre-faults a new pool at start-up
  bool pool_adopted_ = false;
  uint64_t pool_generation_ = 0;
  std::string keeper_state_ = "off";
  std::string weights_files_;  // "": the weights are the model files'; else why they differ
  pid_t keeper_pid_ = 0;       // the keeper start-up handed the memory to
  std::unique_ptr<KeeperWatch> keeper_watch_;  // made by Start()
  std::unique_ptr<DeviceOwner> device_;        // CUDA backend: device weights and pool (null: lost)
  bool cuda_backend_ = false;
  DeviceOwnerOptions device_options_;
  bool device_adopted_ = false;        // device_ is the previous controller's, from baton-keeper
  std::string device_why_;             // why not, when device_ was made anew
  MemoryRecord memory_record_;         // what <state>/memory.json says baton-keeper keeps
  std::unique_ptr<NvmlLibrary> nvml_;  // CUDA backend, where NVML loads: the barrier's check
  std::optional<bool> nvml_lists_engines_;
  std::optional<proto::Listener> listener_;
  std::optional<proto::Listener> router_listener_;  // [controller] router_socket, if set
  std::shared_ptr<proto::SendBudget> client_send_budget_;
  Supervisor supervisor_;
  EngineKeyFile engine_keys_;  // [engine] key_file: BATON_ENGINE_KEYS of each launch
  EngineLogs engine_logs_;     // engine.log_dir kept bounded
  // Declared before every holder of an EngineCgroup (the handles): destroyed last.
  std::unique_ptr<EngineCgroups> cgroups_;
  std::string cgroups_off_reason_;
  RoutePublisher routes_;
  std::unique_ptr<FleetMember> fleet_;  // the node's record in etcd; null without [fleet]
  std::unique_ptr<FleetReportReader> fleet_reports_;     // the fleet routers' reports; with fleet_
  std::unique_ptr<CoordinatorUpgrades> local_upgrades_;  // the rollout's way to the Coordinator
  std::unique_ptr<FleetRollout> rollout_;                // fleet-wide upgrades; with fleet_
  boost::asio::steady_timer tick_;
  boost::asio::steady_timer accept_retry_;
  boost::asio::steady_timer router_accept_retry_;
  boost::asio::steady_timer fleet_load_;    // with fleet_: the pool's use into the node's record
  boost::asio::steady_timer cgroup_sweep_;  // while cgroups of gone engines wait for removal
  bool cgroup_sweep_armed_ = false;
  std::optional<TimePoint> tick_at_;
  std::map<EngineId, EngineHandle> handles_;
  std::map<uint64_t, TimePoint> stall_doubted_;  // engines a stall report was doubted of, when

  struct Connection {
    std::unique_ptr<proto::Channel> channel;
    TimePoint accepted_at;  // a client's: its last answer
    bool cli = false;
    bool busy = false;          // a client's request is being answered
    bool routers_only = false;  // accepted on the router socket
  };
  // Client (batonctl) connections open.
  size_t Clients() const;
  std::map<uint64_t, Connection> conns_;
  uint64_t next_conn_ = 1;
  bool stopping_ = false;
  std::shared_ptr<boost::asio::steady_timer> stop_timer_;
  std::function<void()> stop_done_;
  // The weights' resident bytes as status shows them, computed at most every 2 s.
  int64_t Resident(const PinnedArena& arena) const;
  mutable int64_t resident_bytes_ = -1;
  mutable TimePoint resident_at_{};
  // Last: destroyed first, before the handles and memory its Effects reach.
  std::unique_ptr<Coordinator> coord_;
};

}  // namespace baton
