// Controller: the Coordinator's Effects, carried out on real processes, channels and files.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <set>

#include "base/io/small_file.h"
#include "base/log.h"
#include "controller/controller.h"
#include "controller/upgrade/command_record.h"
#include "cuda/device_session.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

}  // namespace

// --- processes ----------------------------------------------------------------------------------

Result<std::string> Controller::NewToken() { return Supervisor::NewToken(); }

Result<pid_t> Controller::Launch(const LaunchSpec& spec) {
  Result<std::shared_ptr<EngineCgroup>> cgroup =
      cgroups_ != nullptr ? cgroups_->Create(spec.id) : std::shared_ptr<EngineCgroup>();
  if (!cgroup.ok()) return cgroup.status();
  std::set<uint64_t> live = {spec.id};
  for (const auto& [id, h] : handles_) live.insert(id);
  engine_logs_.Prune(live);
  BATON_ASSIGN_OR_RETURN(
      ChildProcess child,
      supervisor_.Launch({.engine_id = spec.id,
                          .role = spec.role,
                          .token = spec.token,
                          .port = spec.port,
                          .command = spec.command,
                          .cgroup = *cgroup != nullptr ? (*cgroup)->spawn_target() : SpawnCgroup{},
                          .engine_keys = engine_keys_.ForLaunch()}));
  EngineHandle& h = handles_[spec.id];
  h.id = spec.id;
  h.cgroup = std::move(cgroup).value();
  h.pid = child.pid();
  h.start_time = ChildProcess::StartTime(child.pid());
  h.process = std::move(child);
  WatchPid(spec.id);
  return h.pid;
}

bool Controller::Kill(EngineId id) {
  EngineHandle* h = Handle(id);
  if (h == nullptr) return false;
  // Killing is the only revocation of a mapping: every process of its group (its workers;
  // the engine itself under a wrapper script) and of its cgroup (any process it started).
  if (nvml_ != nullptr) h->group_pids = EnginePids(*h);
  bool alive = false;
  if (h->process.pidfd() >= 0) {
    Result<std::optional<ExitInfo>> exited = h->process.TryReap();
    alive = exited.ok() && !exited->has_value();
    if (alive) {
      if (Status killed = h->process.Signal(SIGKILL); !killed.ok()) {
        BATON_LOG(ERROR, kLog) << killed.ToString();
      }
    }
  }
  if (h->pid > 0 && ::kill(-h->pid, SIGKILL) != 0 && errno != ESRCH) {
    BATON_LOG(ERROR, kLog)
        << ErrnoStatus("kill of process group " + std::to_string(h->pid), errno).ToString();
  }
  if (h->cgroup != nullptr) {
    if (Status killed = h->cgroup->Kill(); !killed.ok()) {
      BATON_LOG(ERROR, kLog) << killed.ToString();
    }
  }
  if (h->channel != nullptr) h->channel->Close();
  h->channel.reset();
  // An adopted engine found gone at start-up has no pidfd: its exit is known already.
  if (h->process.pidfd() < 0 && !h->exited) h->exited = true;
  return alive;
}

bool Controller::Dying(EngineId id) {
  const EngineHandle* h = Handle(id);
  if (h == nullptr || h->exited) return true;
  std::vector<pollfd> fds;
  if (h->liveness != nullptr)
    fds.push_back({.fd = h->liveness->fd(), .events = POLLIN, .revents = 0});
  if (h->process.pidfd() >= 0)
    fds.push_back({.fd = h->process.pidfd(), .events = POLLIN, .revents = 0});
  if (h->channel != nullptr) {
    fds.push_back({.fd = h->channel->native_handle(), .events = POLLRDHUP, .revents = 0});
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return false;
  // A readable socket is only a message; its peer gone is POLLRDHUP, POLLHUP or POLLERR.
  return std::any_of(fds.begin(), fds.end(), [&](const pollfd& p) {
    const bool socket = h->channel != nullptr && p.fd == h->channel->native_handle();
    return socket ? (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0 : (p.revents & POLLIN) != 0;
  });
}

void Controller::Terminate(EngineId id) {
  EngineHandle* h = Handle(id);
  if (h != nullptr) (void)h->process.Signal(SIGTERM);
}

Result<std::string> Controller::Drill(EngineId id, DrillKind kind) {
  EngineHandle* h = Handle(id);
  if (h == nullptr) return FailedPrecondition("engine " + std::to_string(id) + " is not running");
  switch (kind) {
    case DrillKind::kKill:
      BATON_RETURN_IF_ERROR(h->process.Signal(SIGKILL));
      return std::string();
    case DrillKind::kHang:
      // Stops everything the engine started, as a whole engine that hangs would: its cgroup
      // frozen, or its process group stopped where it has no cgroup or the freeze fails.
      if (h->cgroup != nullptr) {
        Status frozen = h->cgroup->Freeze();
        if (frozen.ok()) return std::string(" by freezing its cgroup");
        BATON_LOG(WARN, kLog) << "engine " << id << ": " << frozen.ToString()
                              << "; stopping its process group instead";
      }
      BATON_RETURN_IF_ERROR(h->process.SignalGroup(SIGSTOP));
      return std::string(" by stopping its process group");
    case DrillKind::kError:
      if (h->channel == nullptr) return FailedPrecondition("the primary is not connected");
      BATON_RETURN_IF_ERROR(h->channel->Send(
          proto::InjectFault{.kind = ToString(kind), .message = "batonctl drill"}));
      return std::string();
  }
  return InvalidArgument("unknown drill");
}

std::string Controller::BarrierHeldBy(EngineId id) {
  EngineHandle* h = Handle(id);
  if (h == nullptr) return "";
  if (ProcessGroupAlive(h->pid)) return "another process of its group lives on";
  if (h->cgroup != nullptr && h->cgroup->Populated()) {
    return "another process of its cgroup lives on (" + h->cgroup->path() + ")";
  }
  std::vector<pid_t> pids = h->group_pids;
  if (h->pid > 0 && std::find(pids.begin(), pids.end(), h->pid) == pids.end()) {
    pids.push_back(h->pid);
  }
  if (GpuStillLists(pids)) return "NVML still lists it on GPU " + device_->pci_bus_id();
  return "";
}

void Controller::Release(EngineId id) {
  handles_.erase(id);  // its cgroup is killed, and removed now or by the sweep
  ArmCgroupSweep();
}

void Controller::ArmCgroupSweep() {
  if (cgroups_ == nullptr || cgroups_->retired().pending() == 0 || cgroup_sweep_armed_) return;
  cgroup_sweep_armed_ = true;
  cgroup_sweep_.expires_after(std::chrono::milliseconds(10));
  cgroup_sweep_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    cgroup_sweep_armed_ = false;
    cgroups_->retired().Sweep();
    ArmCgroupSweep();
  });
}

// --- channels -----------------------------------------------------------------------------------

Status Controller::Send(EngineId id, const ToEngine& message) {
  EngineHandle* h = Handle(id);
  if (h == nullptr || h->channel == nullptr) return Unavailable("not connected");
  return std::visit(Overloaded{
                        [&](const ::baton::SendRegisterAck&) { return SendRegisterAck(*h); },
                        [&](const auto& m) { return h->channel->Send(m); },
                    },
                    message);
}

Status Controller::SendRegisterAck(EngineHandle& h) {
  proto::RegisterAck ack{
      .engine_id = h.id,
      .model = weights_->dir(),
      .arena_size = weights_->arena().size(),
      .arena_huge_pages = weights_->arena().huge_pages(),
      .tensors = {},
      .block_count = config_.block_count,
      .block_bytes = config_.block_bytes,
      .pool_huge_pages = pool_.huge_pages(),
      .reserve_bytes = uint64_t{config_.block_count} * config_.block_bytes,
      .heartbeat_interval_ms = static_cast<uint32_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(config_.heartbeat_interval)
              .count()),
      .device = device_ != nullptr ? device_->device() : -1,
      .device_regions = device_ != nullptr ? kDeviceRegionCount : 0};
  for (const CachedTensor& t : weights_->tensors()) {
    ack.tensors.push_back(
        proto::TensorEntry{t.name, static_cast<uint8_t>(t.dtype), t.shape, t.offset, t.size});
  }
  if (weights_->arena().partial() && h.channel->version() < proto::kProtocolVersionPartialArena) {
    const std::string why =
        "the weight arena is partly on huge pages (two memfds), which this "
        "engine's protocol " +
        std::to_string(h.channel->version()) + " cannot map (it needs " +
        std::to_string(proto::kProtocolVersionPartialArena) + ")";
    (void)h.channel->Send(proto::Stop{.reason = why});
    return FailedPrecondition(why);
  }
  BATON_ASSIGN_OR_RETURN(std::vector<UniqueFd> arena_fds, weights_->arena().DupFds());
  BATON_ASSIGN_OR_RETURN(UniqueFd pool_fd, pool_.Dup());
  // [arena, pool] or, for a partial arena, [arena's huge part, pool, arena's 4 KiB part].
  std::vector<int> fds{arena_fds[0].get(), pool_fd.get()};
  if (arena_fds.size() > 1) fds.push_back(arena_fds[1].get());
  BATON_RETURN_IF_ERROR(h.channel->Send(ack, fds));
  if (device_ != nullptr) {
    BATON_RETURN_IF_ERROR(device_->Share(*h.channel).WithContext("sending the device regions"));
  }
  return OkStatus();
}

void Controller::Disconnect(EngineId id) {
  EngineHandle* h = Handle(id);
  if (h == nullptr || h->channel == nullptr) return;
  h->channel->Close();
  h->channel.reset();
}

bool Controller::PublishRoutes(proto::RouteTable table) {
  const bool changed = routes_.Publish(std::move(table));
  // The node's record carries the table as published, with the version it was given.
  if (fleet_ != nullptr)
    fleet_->Publish(routes_.current(), FleetLoad(), std::chrono::steady_clock::now());
  return changed;
}

NodeFacts Controller::FleetFacts() const {
  return {.weights_id = WeightsId(weights_->tensors()),
          .tensors = weights_->tensors().size(),
          .tensor_bytes = weights_->tensor_bytes(),
          .pool_blocks = config_.block_count,
          .block_bytes = config_.block_bytes};
}

void Controller::ArmFleetLoad() {
  if (fleet_ == nullptr || stopping_) return;
  fleet_load_.expires_after(FleetMember::kLoadInterval);
  fleet_load_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    fleet_->NoteLoad(FleetLoad(), std::chrono::steady_clock::now());
    ArmFleetLoad();
  });
}

NodeLoad Controller::FleetLoad() const {
  const LedgerSnapshot s = coord_->ledger().Snapshot();
  return {.granted_blocks = s.granted_blocks, .leases = s.leases};
}

std::map<uint64_t, proto::EngineOutcome> Controller::RouterOutcomes() const {
  return routes_.Outcomes();
}

size_t Controller::RouterCount() const { return routes_.router_count(); }

// --- state on disk ------------------------------------------------------------------------------

Status Controller::SaveRoster(const Roster& roster) {
  Roster r = roster;
  r.boot_id = BootId();
  for (RosterEngine& e : r.engines) {
    if (const EngineHandle* h = Handle(e.id); h != nullptr) {
      e.start_time = h->start_time;
      if (h->cgroup != nullptr) e.cgroup = h->cgroup->path();
    }
  }
  // In place, not fsynced: it lists processes, which a reboot ends, and it is written before
  // every promotion and grant (controller/roster_file.h).
  return roster_file_.Save(std::move(r));
}

Status Controller::SaveCommandRecord(const CommandRecord& record) {
  return baton::SaveCommandRecord(config_.command_record_path(), record);
}

}  // namespace baton
