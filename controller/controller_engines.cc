// Controller: engine channels and pidfds, turned into Coordinator events.
#include <fcntl.h>

#include <algorithm>
#include <boost/asio/post.hpp>

#include "base/check.h"
#include "base/log.h"
#include "base/process/proc_table.h"
#include "controller/controller.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

// Decodes `msg` as a T into `out`; a payload that does not decode closes the connection
// (protocol error) and returns the reason.
template <typename T>
std::string DecodeInto(proto::Channel& channel, const proto::ReceivedMessage& msg,
                       std::optional<FromEngine>* out) {
  Result<T> decoded = msg.As<T>();
  if (decoded.ok()) {
    out->emplace(std::move(decoded).value());
    return "";
  }
  channel.CloseWithError(decoded.status());
  return decoded.status().message();
}

}  // namespace

EngineHandle* Controller::Handle(EngineId id) {
  auto it = handles_.find(id);
  return it == handles_.end() ? nullptr : &it->second;
}

std::vector<EngineProcesses> Controller::EngineProcessList() const {
  std::vector<EngineProcesses> out;
  for (const auto& [id, h] : handles_) {
    // A gone leader's pid may be given to another process once its group is empty too; an
    // adopted engine found gone (no process) may have left its pid to another long ago.
    const bool leader_counts =
        h.pid > 0 && h.process.pid() != 0 && (!h.exited || ProcessGroupAlive(h.pid));
    out.push_back({.id = id,
                   .leader = leader_counts ? h.pid : 0,
                   .cgroup = h.cgroup != nullptr ? h.cgroup->path() : ""});
  }
  return out;
}

Status Controller::CheckPeerOrigin(const proto::Hello& hello, EngineId token_engine,
                                   const Peer& peer) const {
  const std::vector<EngineProcesses> engines = EngineProcessList();
  std::string rule;
  const std::optional<uint64_t> owner = EngineOwning(peer.pid, engines, &rule);
  const std::string who = "pid " + std::to_string(peer.pid);
  // Asked after /proc was read: what it said was this process's only if it still runs.
  if (ConnectedProcessGone(peer.pid, peer.pidfd)) {
    return FailedPrecondition("role '" + std::string(ToString(hello.role)) + "' from " + who +
                              ", which is gone: a Hello is served only while the process that "
                              "connected runs");
  }
  if (hello.role != proto::PeerRole::kEngine) {
    if (!owner.has_value()) return OkStatus();
    return FailedPrecondition("role '" + std::string(ToString(hello.role)) + "' from " + who +
                              ", a process of engine " + std::to_string(*owner) + " (" + rule +
                              "): an engine may not command the controller");
  }
  if (owner == token_engine) return OkStatus();
  const EngineHandle* h = nullptr;
  if (auto it = handles_.find(token_engine); it != handles_.end()) h = &it->second;
  return FailedPrecondition("engine " + std::to_string(token_engine) +
                            "'s launch token came from " + who +
                            ", which is not a process of engine " + std::to_string(token_engine) +
                            (h != nullptr ? " (pid " + std::to_string(h->pid) + ")" : "") +
                            (owner.has_value() ? " but of engine " + std::to_string(*owner) : ""));
}

void Controller::AttachEngine(EngineId id, std::unique_ptr<proto::Channel> channel) {
  EngineHandle* h = Handle(id);
  if (h == nullptr) return;
  h->channel = std::move(channel);
  h->channel->set_label("engine " + std::to_string(id));
  h->channel->SetSendBudget(nullptr);  // the clients' budget is not the engines' to spend
  ++h->channel_gen;
  coord_->OnConnected(id, h->channel->version());
  ReadEngine(id);
}

void Controller::ReadEngine(EngineId id) {
  EngineHandle* h = Handle(id);
  if (h == nullptr || h->channel == nullptr) return;
  const uint64_t gen = h->channel_gen;
  h->channel->AsyncReceive([this, id, gen](Result<proto::ReceivedMessage> msg) {
    EngineHandle* h = Handle(id);
    if (h == nullptr || h->channel == nullptr || h->channel_gen != gen) return;
    if (!msg.ok()) {
      h->channel.reset();
      // A clean close is Unavailable; anything else was a protocol error on this connection.
      coord_->OnDisconnected(id, msg.status().message(),
                             msg.status().code() != StatusCode::kUnavailable);
    } else {
      WatchLiveness(id, *msg);
      OnEngineMessage(id, *msg);
      h = Handle(id);
      if (h != nullptr && h->channel != nullptr && h->channel_gen == gen) ReadEngine(id);
    }
    ArmTick();
  });
}

void Controller::OnEngineMessage(EngineId id, const proto::ReceivedMessage& msg) {
  EngineHandle* handle = Handle(id);
  BATON_CHECK(handle != nullptr) << "a message read for engine " << id << ", which has no handle";
  EngineHandle& h = *handle;
  using proto::MsgType;
  std::optional<FromEngine> decoded;
  std::string error;
  switch (msg.type) {
    case MsgType::kRegister:
      error = DecodeInto<proto::Register>(*h.channel, msg, &decoded);
      break;
    case MsgType::kReattach:
      error = DecodeInto<proto::Reattach>(*h.channel, msg, &decoded);
      break;
    case MsgType::kStandbyReady:
      error = DecodeInto<proto::StandbyReady>(*h.channel, msg, &decoded);
      break;
    case MsgType::kHeartbeat:
      error = DecodeInto<proto::Heartbeat>(*h.channel, msg, &decoded);
      break;
    case MsgType::kProgress:
      error = DecodeInto<proto::Progress>(*h.channel, msg, &decoded);
      break;
    case MsgType::kLeaseRequest:
      error = DecodeInto<proto::LeaseRequest>(*h.channel, msg, &decoded);
      break;
    case MsgType::kReturnExtents:
      error = DecodeInto<proto::ReturnExtents>(*h.channel, msg, &decoded);
      break;
    case MsgType::kErrorReport:
      error = DecodeInto<proto::ErrorReport>(*h.channel, msg, &decoded);
      break;
    case MsgType::kPromoteAck:
      error = DecodeInto<proto::PromoteAck>(*h.channel, msg, &decoded);
      break;
    case MsgType::kDrained:
      error = DecodeInto<proto::Drained>(*h.channel, msg, &decoded);
      break;
    case MsgType::kShareMemoryAck:
      error = DecodeInto<proto::ShareMemoryAck>(*h.channel, msg, &decoded);
      break;
    case MsgType::kErrorMsg:
      error = DecodeInto<proto::ErrorMsg>(*h.channel, msg, &decoded);
      break;
    case MsgType::kKvAdopted:
      error = DecodeInto<proto::KvAdopted>(*h.channel, msg, &decoded);
      break;
    case MsgType::kKvInherited:
      error = DecodeInto<proto::KvInherited>(*h.channel, msg, &decoded);
      break;
    default:
      return coord_->OnUnexpectedMessage(id, proto::MsgTypeName(msg.type));
  }
  if (!decoded.has_value()) {
    h.channel.reset();
    return coord_->OnBadMessage(id, "malformed " + proto::MsgTypeName(msg.type) + ": " + error);
  }
  if (const auto* ack = std::get_if<proto::ShareMemoryAck>(&*decoded); ack && ack->mapped) {
    h.device_memory = "mapped";
  }
  // Registered, or re-adopted after a controller restart: NVML must list it if it mapped
  // device memory (a restarted controller asks again).
  const bool ready = std::holds_alternative<proto::StandbyReady>(*decoded) ||
                     std::holds_alternative<proto::Reattach>(*decoded);
  coord_->OnMessage(id, *decoded);
  if (EngineHandle* still = Handle(id); ready && still != nullptr) CheckNvmlSeesEngine(*still);
}

// --- pidfds -------------------------------------------------------------------------------------

void Controller::WatchPid(EngineId id) {
  EngineHandle* h = Handle(id);
  if (h == nullptr || h->process.pidfd() < 0) return;
  const int fd = ::fcntl(h->process.pidfd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    BATON_LOG(ERROR, kLog) << "cannot watch engine " << id << ": dup of its pidfd failed";
    return;
  }
  h->pid_watch = std::make_unique<boost::asio::posix::stream_descriptor>(io_, fd);
  h->pid_watch->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                           [this, id](const boost::system::error_code& ec) {
                             if (ec) return;  // the handle is gone
                             OnPidReadable(id);
                           });
}

void Controller::OnPidReadable(EngineId id) {
  EngineHandle* h = Handle(id);
  if (h == nullptr || h->exited) return;
  Result<std::optional<ExitInfo>> exited = h->process.TryReap();
  if (!exited.ok()) {
    BATON_LOG(ERROR, kLog) << "reaping engine " << id << ": " << exited.status().ToString();
    return;
  }
  if (!exited->has_value()) return WatchPid(id);  // not yet: wait again
  h->exited = true;
  h->channel.reset();
  coord_->OnExited(id, ExitWords(*h, **exited));
  if (stopping_ && coord_->Remaining().empty() && stop_timer_ != nullptr) stop_timer_->cancel();
  ArmTick();
}

// A crash: an engine that ended on its own or failed (it died, lost its connection, hung,
// reported an error, timed out or misbehaved), before or after its fence; not one the
// controller retired (a switch-over, a drain, a stop, an upgrade's replaced standby, a stale
// epoch, one a restart could not account for).
bool Controller::Crashed(EngineId id) const {
  if (stopping_) return false;
  const EngineRecord* e = coord_->engine(id);
  if (e == nullptr) return false;
  if (!e->fail_cause.has_value()) return true;  // its exit is the first sign
  switch (*e->fail_cause) {
    case FailCause::kPlanned:
    case FailCause::kShutdown:
    case FailCause::kStale:
    case FailCause::kUnaccounted:
      return false;
    case FailCause::kDied:
    case FailCause::kEof:
    case FailCause::kHung:
    case FailCause::kError:
    case FailCause::kTimeout:
    case FailCause::kMisbehaved:
      return true;
  }
  return true;
}

// An engine that exits on its own with an error says why in its log, not to the controller:
// its last line is quoted. The log of one that crashed is kept apart from the pruned ones
// (EngineLogs::KeepCrashed).
std::string Controller::ExitWords(const EngineHandle& h, const ExitInfo& exit) {
  std::string notes;
  if (!exit.unknown && exit.code != 0 && exit.signal == 0) {
    if (const std::string last = engine_logs_.LastLine(h.id); !last.empty()) {
      notes = "its log ends: \"" + last + "\"";
    }
  }
  // An adopted engine's exit is not known, nor is a clean exit always no failure: the
  // Coordinator's cause decides.
  if (Crashed(h.id)) {
    if (const std::string kept = engine_logs_.KeepCrashed(h.id); !kept.empty()) {
      notes += (notes.empty() ? "" : "; ") + std::string("log kept as ") + kept;
    }
  }
  return notes.empty() ? exit.ToString() : exit.ToString() + " (" + notes + ")";
}

// --- liveness pages -----------------------------------------------------------------------------

void Controller::WatchLiveness(EngineId id, proto::ReceivedMessage& msg) {
  using proto::MsgType;
  if (msg.fds.size() != 1 ||
      (msg.type != MsgType::kStandbyReady && msg.type != MsgType::kReattach)) {
    return;
  }
  EngineHandle* h = Handle(id);
  if (h == nullptr) return;
  Result<std::unique_ptr<proto::LivenessWatch>> watch =
      proto::LivenessWatch::Start(std::move(msg.fds[0]));
  const int fd = watch.ok() ? ::fcntl((*watch)->fd(), F_DUPFD_CLOEXEC, 0) : -1;
  if (fd < 0) {
    const Status why = watch.ok() ? ErrnoStatus("dup of its eventfd", errno) : watch.status();
    BATON_LOG(WARN, kLog) << "engine " << id << ": its liveness page is not watched ("
                          << why.ToString() << "); its death is seen when its connection ends";
    return;
  }
  h->liveness = std::move(watch).value();
  BATON_LOG(INFO, kLog) << "engine " << id << ": its liveness page is watched";
  h->liveness_wait = std::make_unique<boost::asio::posix::stream_descriptor>(io_, fd);
  h->liveness_wait->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                               [this, id, pid = h->pid](const boost::system::error_code& ec) {
                                 if (!ec) OnEngineDying(id, pid);
                               });
}

void Controller::OnEngineDying(EngineId id, pid_t pid, int deferred) {
  constexpr int kMaxDeferrals = 100;
  EngineHandle* h = Handle(id);
  if (h == nullptr || h->pid != pid || h->exited) return;
  // An ErrorReport or a Drained sent just before the death is read first: the read already
  // under way takes it while this waits behind it on the event loop.
  if (h->channel != nullptr && h->channel->HasUnread() && deferred < kMaxDeferrals) {
    boost::asio::post(io_, [this, id, pid, deferred] { OnEngineDying(id, pid, deferred + 1); });
    return;
  }
  coord_->OnDying(id, "its process is exiting (the thread that held its liveness page died)");
  ArmTick();
}

// --- the barrier's checks -----------------------------------------------------------------------

std::vector<pid_t> Controller::EnginePids(const EngineHandle& h) const {
  std::vector<pid_t> pids = ProcessGroupMembers(h.pid);
  if (h.cgroup != nullptr) {
    for (pid_t pid : h.cgroup->Members()) {
      if (std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
    }
  }
  if (h.pid > 0 && std::find(pids.begin(), pids.end(), h.pid) == pids.end()) {
    pids.push_back(h.pid);
  }
  return pids;
}

bool Controller::GpuStillLists(const std::vector<pid_t>& pids) {
  if (nvml_ == nullptr || device_ == nullptr || pids.empty()) return false;
  Result<std::vector<pid_t>> listed = nvml_->ComputePids(device_->pci_bus_id());
  if (!listed.ok()) {
    BATON_LOG(WARN, kLog) << "barrier: " << listed.status().message()
                          << "; going on with the reap as the barrier";
    return false;
  }
  for (pid_t pid : pids) {
    if (std::find(listed->begin(), listed->end(), pid) != listed->end()) return true;
  }
  return false;
}

// The barrier's GPU half asks NVML whether a reaped engine's pids are still on the GPU. An
// engine that mapped device memory has a context, so NVML must list it now; if it does not
// (the controller in another PID namespace than the pids NVML reports, a container without
// --pid=host), that half cannot see anything: said once, loudly, and in `status`.
void Controller::CheckNvmlSeesEngine(EngineHandle& h) {
  if (nvml_ == nullptr || device_ == nullptr || h.device_memory != "mapped") return;
  if (nvml_lists_engines_.value_or(false)) return;
  const bool listed = GpuStillLists(EnginePids(h));
  if (listed) {
    BATON_LOG(INFO, kLog) << "barrier: NVML lists engine " << h.id << "'s process on GPU "
                          << device_->pci_bus_id() << ": the barrier waits for its release";
  } else if (!nvml_lists_engines_.has_value()) {
    BATON_LOG(ERROR, kLog) << "barrier: NVML does not list engine " << h.id << " (pid " << h.pid
                           << ") on GPU " << device_->pci_bus_id()
                           << " although it mapped device memory; the controller may run in "
                              "another PID namespace than NVML reports (a container without "
                              "--pid=host): blocks move on at the reap, without the driver's "
                              "release";
  }
  nvml_lists_engines_ = listed;
}

}  // namespace baton
