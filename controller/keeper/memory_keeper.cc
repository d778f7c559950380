#include "controller/keeper/memory_keeper.h"

#include <unistd.h>

#include <algorithm>

#include "base/io/small_file.h"
#include "base/log.h"
#include "base/process/proc_table.h"
#include "proto/hello.h"

namespace baton {
namespace {

constexpr const char* kLog = "keeper";
// A manifest holds a tensor table: as large as the controller's frames to engines.
constexpr size_t kMaxKeeperFrame = proto::kControllerMaxFrameSize;

proto::ChannelOptions KeeperChannelOptions() {
  return proto::ChannelOptions{.max_frame_size = kMaxKeeperFrame,
                               .max_send_frame_size = kMaxKeeperFrame,
                               .label = "controller"};
}

}  // namespace

Result<MemoryKeeper> MemoryKeeper::Bind(const KeeperOptions& options) {
  if (options.controllers.empty()) return InvalidArgument("baton-keeper: no controller program");
  auto io = std::make_unique<boost::asio::io_context>();
  BATON_ASSIGN_OR_RETURN(proto::Listener listener,
                         proto::Listener::Bind(*io, options.socket_path, KeeperChannelOptions()));
  return MemoryKeeper(options, std::move(io), std::move(listener));
}

std::vector<std::string> MemoryKeeper::names() const {
  std::vector<std::string> out;
  for (const auto& [name, item] : items_) out.push_back(name);
  return out;
}

void MemoryKeeper::Run() {
  BATON_LOG(INFO, kLog) << "keeping memory for the controller at " << options_.socket_path;
  const std::string pid_file = options_.socket_path + ".pid";
  if (Status written = ReplaceFile(pid_file, std::to_string(::getpid()) + "\n"); !written.ok()) {
    BATON_LOG(WARN, kLog) << written.ToString();
  }
  struct RemovePidFile {
    std::string path;
    ~RemovePidFile() { ::unlink(path.c_str()); }
  } remove{pid_file};
  while (true) {
    const Duration wait = items_.empty() ? options_.empty_exit : std::chrono::hours(24);
    Result<proto::Channel> channel = listener_.Accept(wait);
    if (!channel.ok()) {
      if (channel.status().code() == StatusCode::kDeadlineExceeded && items_.empty()) {
        BATON_LOG(INFO, kLog) << "nothing kept and no controller for a while: exiting";
        return;
      }
      if (channel.status().code() != StatusCode::kDeadlineExceeded) {
        BATON_LOG(WARN, kLog) << "accept: " << channel.status().ToString();
      }
      continue;
    }
    if (!Serve(*channel)) return;
  }
}

Status MemoryKeeper::AdmitProcess(proto::Channel& channel) const {
  BATON_ASSIGN_OR_RETURN(proto::PeerCredentials peer, channel.peer_credentials());
  Result<UniqueFd> pidfd = channel.peer_pidfd();
  const std::string program = ProcessProgram(peer.pid);
  if (ConnectedProcessGone(peer.pid, pidfd.ok() ? pidfd->get() : -1)) {
    return FailedPrecondition("the process that connected (pid " + std::to_string(peer.pid) +
                              ") is gone");
  }
  const std::vector<std::string>& allowed = options_.controllers;
  if (std::find(allowed.begin(), allowed.end(), program) != allowed.end()) return OkStatus();
  std::string served;
  for (const std::string& path : allowed) served += (served.empty() ? "" : ", ") + path;
  return FailedPrecondition("baton-keeper serves the controller (" + served + ") only; pid " +
                            std::to_string(peer.pid) + " runs " +
                            (program.empty() ? "a program it cannot read" : program));
}

bool MemoryKeeper::Serve(proto::Channel& channel) {
  proto::ServerHelloOptions hello{
      .server_name = "baton-keeper", .admit = [this, &channel](const proto::Hello& h) {
        if (h.role != proto::PeerRole::kController) {
          return FailedPrecondition("baton-keeper serves the controller only");
        }
        return AdmitProcess(channel);
      }};
  Result<proto::AcceptedHello> accepted = proto::ServerHello(channel, hello);
  if (!accepted.ok()) {
    BATON_LOG(WARN, kLog) << "refused a connection: " << accepted.status().message();
    return true;
  }
  while (true) {
    Result<proto::ReceivedMessage> msg = channel.Receive(options_.idle_timeout);
    if (!msg.ok()) return true;  // closed, broken or idle: the next controller connects anew
    if (!Handle(channel, *msg)) return false;
  }
}

bool MemoryKeeper::Handle(proto::Channel& channel, proto::ReceivedMessage& msg) {
  proto::KeptMemory answer;
  std::vector<int> fds;
  bool go_on = true;
  if (msg.type == proto::MsgType::kKeepMemory) {
    Result<proto::KeepMemory> keep = msg.As<proto::KeepMemory>();
    if (!keep.ok()) return channel.Send(proto::ErrorMsg::FromStatus(keep.status())).ok();
    if (items_.count(keep->name) == 0 && items_.size() >= options_.max_items) {
      return channel
          .Send(proto::ErrorMsg::FromStatus(ResourceExhausted(
              "baton-keeper keeps at most " + std::to_string(options_.max_items) + " items")))
          .ok();
    }
    Item& item = items_[keep->name];
    item.manifest = keep->manifest;
    item.fds = std::move(msg.fds);
    BATON_LOG(INFO, kLog) << "keeping '" << keep->name << "' (" << item.fds.size() << " fds)";
    answer = proto::KeptMemory{.name = keep->name, .found = true, .manifest = ""};
  } else if (msg.type == proto::MsgType::kFetchMemory) {
    Result<proto::FetchMemory> fetch = msg.As<proto::FetchMemory>();
    if (!fetch.ok()) return channel.Send(proto::ErrorMsg::FromStatus(fetch.status())).ok();
    answer.name = fetch->name;
    auto it = items_.find(fetch->name);
    if (it != items_.end()) {
      answer.found = true;
      answer.manifest = it->second.manifest;
      for (const UniqueFd& fd : it->second.fds) fds.push_back(fd.get());
    }
  } else if (msg.type == proto::MsgType::kReleaseMemory) {
    Result<proto::ReleaseMemory> release = msg.As<proto::ReleaseMemory>();
    if (!release.ok()) return channel.Send(proto::ErrorMsg::FromStatus(release.status())).ok();
    answer.name = release->name;
    if (release->name.empty()) {
      BATON_LOG(INFO, kLog) << "releasing everything (" << items_.size() << " items) and exiting";
      items_.clear();
      go_on = false;
    } else {
      answer.found = items_.erase(release->name) > 0;
      BATON_LOG(INFO, kLog) << "released '" << release->name << "'";
    }
  } else {
    return channel
        .Send(proto::ErrorMsg::FromStatus(
            InvalidArgument("baton-keeper does not take " + proto::MsgTypeName(msg.type))))
        .ok();
  }
  if (Status sent = channel.Send(answer, fds); !sent.ok()) {
    BATON_LOG(WARN, kLog) << "answering the controller: " << sent.ToString();
  }
  return go_on;
}

}  // namespace baton
