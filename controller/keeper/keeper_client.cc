#include "controller/keeper/keeper_client.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "base/io/private_dir.h"
#include "base/io/self_exe.h"
#include "base/log.h"
#include "base/process/close_fds.h"
#include "base/process/pidfd.h"
#include "base/process/proc_table.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"

namespace baton {
namespace {

constexpr Duration kAnswerTimeout = std::chrono::seconds(5);
// How long one try waits for the answer to Hello, which a keeper gives at once: a stopped
// keeper that has not answered in this long is hung (one that runs gets its grace).
constexpr Duration kHelloTimeout = std::chrono::seconds(1);
// Tries of one request: the first, and on a new connection after the keeper closed one (a
// process that stalls right after connecting may find even the new one closed).
constexpr int kAttempts = 3;

proto::ChannelOptions ClientOptions() {
  return proto::ChannelOptions{.max_frame_size = proto::kControllerMaxFrameSize,
                               .max_send_frame_size = proto::kControllerMaxFrameSize,
                               .label = "baton-keeper"};
}

// The answer to the request just sent: a KeptMemory, or the keeper's ErrorMsg as a Status.
Result<std::pair<proto::KeptMemory, std::vector<UniqueFd>>> Answer(proto::Channel& channel) {
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(kAnswerTimeout));
  BATON_ASSIGN_OR_RETURN(proto::KeptMemory kept, msg.As<proto::KeptMemory>());
  return std::make_pair(std::move(kept), std::move(msg.fds));
}

int64_t Millis(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

bool Stopped(pid_t pid) {
  const std::optional<ProcStat> stat = ReadProcStat(pid);
  return stat.has_value() && (stat->state == 'T' || stat->state == 't');
}

// Whether the peer of the connected socket `fd` is gone (closed, reset, or its listener
// closed while the connection waited to be accepted).
bool PeerGone(int fd) {
  pollfd p{.fd = fd, .events = POLLRDHUP, .revents = 0};
  return fd < 0 || ::poll(&p, 1, 0) < 0 || (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

// Waits up to `limit` for the process of `pidfd` to exit (its pidfd turns readable).
void AwaitExit(int pidfd, Duration limit) {
  pollfd exited{.fd = pidfd, .events = POLLIN, .revents = 0};
  while (::poll(&exited, 1, static_cast<int>(Millis(limit))) < 0 && errno == EINTR) {
  }
}

// SIGKILL to the baton-keeper `pid` that did not answer on the still open connection `fd`,
// through a pidfd; awaited (the pidfd turns readable) for `exit_wait`. The pidfd is taken
// before the connection is checked: the keeper holds its only other end (or the listening
// socket it waits behind), so a connection still open afterwards shows the keeper was alive
// when the pidfd was taken, and the pidfd names it, not a process that reused its pid. A
// process of another name is left alone. Logs `seen` and what was done.
void KillUnanswered(pid_t pid, int fd, const std::string& socket_path, const std::string& seen,
                    Duration exit_wait) {
  UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd || PeerGone(fd)) return;  // gone already: its socket is stale
  if (const std::string name = ProcessName(pid); name != "baton-keeper") {
    BATON_LOG(WARN, "keeper") << "a process (pid " << pid << ", " << name << ") at " << socket_path
                              << " accepted but did not answer within " << seen
                              << ": not baton-keeper; left alone";
    return;
  }
  if (PidfdSendSignal(pidfd.get(), SIGKILL) != 0) return;
  BATON_LOG(WARN, "keeper") << "baton-keeper (pid " << pid << ") at " << socket_path
                            << " accepted but did not answer within " << seen
                            << ": hung; killed, and a new one is started";
  AwaitExit(pidfd.get(), exit_wait);
}

// SIGKILL to the baton-keeper that refused this controller's Hello with `reason`: it serves
// the controller's program as it was when the keeper started, and this one runs another (the
// install moved), so what it keeps can no longer be had, and it would hold that memory beside
// what this controller makes anew. `pidfd` names it (SO_PEERPIDFD of the refused connection).
// A process of another name is left alone. Awaited for `exit_wait`.
void KillRefusing(pid_t pid, int pidfd, const std::string& socket_path, const std::string& reason,
                  Duration exit_wait) {
  if (const std::string name = ProcessName(pid); name != "baton-keeper") {
    BATON_LOG(WARN, "keeper") << "a process (pid " << pid << ", " << name << ") at " << socket_path
                              << " refused this controller (" << reason
                              << "): not baton-keeper; left alone";
    return;
  }
  if (PidfdSendSignal(pidfd, SIGKILL) != 0) return;
  BATON_LOG(WARN, "keeper") << "baton-keeper (pid " << pid << ") at " << socket_path
                            << " refused this controller (" << reason
                            << "): killed, what it kept is loaded afresh, and a new one is started";
  AwaitExit(pidfd, exit_wait);
}

}  // namespace

std::string KeeperClient::DefaultBinary() {
  const std::string dir = SelfExeDir();
  if (dir.empty()) return "";
  const std::string path = dir + "/baton-keeper";
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

Status StartDetachedKeeper(const std::string& binary, const std::string& socket_path,
                           const std::string& log_path) {
  const std::string log = log_path.empty() ? "/dev/null" : log_path;
  const std::string self = ProcessProgram(::getpid());
  if (self.empty()) return Internal("starting " + binary + ": /proc/self/exe cannot be read");
  const pid_t child = ::fork();
  if (child < 0) return ErrnoStatus("fork", errno);
  if (child == 0) {
    // In the child: a session of its own, then a grandchild that the init process (or the
    // nearest subreaper) adopts once this child exits. Async-signal-safe calls only.
    ::setsid();
    const pid_t grandchild = ::fork();
    if (grandchild != 0) ::_exit(grandchild < 0 ? 1 : 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | kPrivateFileFlags, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    const int null_in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_in >= 0) ::dup2(null_in, STDIN_FILENO);
    SweepFdsFrom(3, FdSweep::kClose);
    const char* argv[] = {binary.c_str(), "--socket",   socket_path.c_str(),
                          "--controller", self.c_str(), nullptr};
    ::execv(binary.c_str(), const_cast<char* const*>(argv));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Internal("starting " + binary + ": its launcher failed");
  }
  return OkStatus();
}

Result<KeeperClient> KeeperClient::TryConnect(const std::string& socket_path,
                                              Duration hello_timeout, Unanswered* hung,
                                              Refusing* refusing) {
  auto io = std::make_unique<boost::asio::io_context>();
  BATON_ASSIGN_OR_RETURN(proto::Channel channel, proto::Connect(*io, socket_path, ClientOptions()));
  // Who listens, read before the Hello: a refusal closes the channel.
  Result<proto::PeerCredentials> listener = channel.peer_credentials();
  Result<UniqueFd> listener_pidfd =
      refusing != nullptr ? channel.peer_pidfd() : Result<UniqueFd>(Unimplemented("not asked"));
  Status hello = proto::ClientHello(channel, {.peer_name = "baton-controller",
                                              .role = proto::PeerRole::kController,
                                              .launch_token = "",
                                              .min_version = proto::kProtocolVersionReattach,
                                              .timeout = hello_timeout})
                     .status();
  if (!hello.ok()) {
    if (refusing != nullptr && listener.ok() && hello.code() == StatusCode::kFailedPrecondition) {
      *refusing = Refusing{.pid = listener->pid,
                           .pidfd = listener_pidfd.ok() ? std::move(*listener_pidfd)
                                                        : UniqueFd(PidfdOpen(listener->pid))};
    }
    if (hung != nullptr && listener.ok() && hello.code() == StatusCode::kDeadlineExceeded) {
      *hung = Unanswered{.pid = listener->pid,
                         .io = std::move(io),
                         .channel = std::make_unique<proto::Channel>(std::move(channel))};
    }
    return hello;
  }
  return KeeperClient(socket_path, std::move(io), std::move(channel));
}

Result<KeeperClient> KeeperClient::AwaitUnanswered(const std::string& socket_path, Unanswered first,
                                                   Duration grace, Duration exit_wait) {
  const auto until = std::chrono::steady_clock::now() - kHelloTimeout + grace;
  Unanswered last = std::move(first);
  Duration waited = kHelloTimeout;  // the Hello timeouts of the tries so far
  while (true) {
    std::string seen;
    if (Stopped(last.pid)) {
      seen = std::to_string(Millis(waited)) + " ms and is stopped";
    } else if (std::chrono::steady_clock::now() >= until) {
      seen = std::to_string(Millis(std::max(grace, kHelloTimeout))) +
             " ms while it runs (busy or deadlocked)";
    }
    if (!seen.empty()) {
      KillUnanswered(last.pid, last.channel->native_handle(), socket_path, seen, exit_wait);
      return DeadlineExceeded("the process (pid " + std::to_string(last.pid) +
                              ") there accepted but did not answer");
    }
    const Duration timeout =
        std::min<Duration>(kHelloTimeout, until - std::chrono::steady_clock::now());
    // Closed before the next try: a keeper serves one connection at a time, and one that wakes
    // would answer this one and wait on it, a try behind for ever, were it kept open.
    last.channel.reset();  // before the io_context it was made on
    last.io.reset();
    Unanswered next;
    Result<KeeperClient> client = TryConnect(socket_path, timeout, &next);
    if (client.ok() || next.pid <= 0) return client;
    waited += timeout;
    last = std::move(next);
  }
}

template <typename Msg>
Result<std::pair<proto::KeptMemory, std::vector<UniqueFd>>> KeeperClient::Request(
    const Msg& msg, const std::vector<int>& fds) {
  using Answered = Result<std::pair<proto::KeptMemory, std::vector<UniqueFd>>>;
  Status sent = channel_->Send(msg, fds);
  Answered answer = sent.ok() ? Answer(*channel_) : Answered(sent);
  for (int attempt = 1; attempt < kAttempts; ++attempt) {
    // A keeper that does not answer in time is not asked again; anything else may be a
    // connection the keeper closed (idle for its timeout, or a keeper started anew).
    if (answer.ok() || answer.status().code() == StatusCode::kDeadlineExceeded) return answer;
    BATON_LOG(INFO, "keeper") << "the connection to baton-keeper is closed ("
                              << answer.status().message() << "): connecting again";
    BATON_ASSIGN_OR_RETURN(KeeperClient fresh, TryConnect(socket_path_, kHelloTimeout));
    *this = std::move(fresh);
    sent = channel_->Send(msg, fds);
    answer = sent.ok() ? Answer(*channel_) : Answered(sent);
  }
  return answer;
}

KeeperClient& KeeperClient::operator=(KeeperClient&& other) noexcept {
  if (this == &other) return *this;
  channel_.reset();  // before the io_context its socket was made on goes
  socket_path_ = std::move(other.socket_path_);
  io_ = std::move(other.io_);
  channel_ = std::move(other.channel_);
  return *this;
}

Result<KeeperClient> KeeperClient::Connect(const std::string& socket_path,
                                           const std::string& keeper_binary,
                                           const std::string& log_path, Duration wait,
                                           Duration grace, Duration exit_wait) {
  Unanswered hung;
  Refusing refusing;
  Result<KeeperClient> client = TryConnect(socket_path, kHelloTimeout, &hung, &refusing);
  if (!client.ok() && keeper_binary.empty() && refusing.pid > 0) {
    BATON_LOG(WARN, "keeper") << "baton-keeper (pid " << refusing.pid << ") at " << socket_path
                              << " refused this process (" << client.status().message()
                              << "): what it keeps is no use here; only the controller of its "
                                 "program, or a kill of it, lets it go";
  }
  if (client.ok() || keeper_binary.empty()) return client;
  if (refusing.pid > 0 && refusing.pidfd) {
    KillRefusing(refusing.pid, refusing.pidfd.get(), socket_path, client.status().message(),
                 exit_wait);
  } else if (hung.pid > 0) {
    client = AwaitUnanswered(socket_path, std::move(hung), grace, exit_wait);
    if (client.ok()) return client;
  }
  BATON_LOG(INFO, "keeper") << "no baton-keeper at " << socket_path << " ("
                            << client.status().message() << "): starting " << keeper_binary;
  BATON_RETURN_IF_ERROR(StartDetachedKeeper(keeper_binary, socket_path, log_path));
  const auto until = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < until) {
    client = TryConnect(socket_path, kHelloTimeout);
    if (client.ok()) return client;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return client.status().WithContext("baton-keeper did not answer after it was started");
}

Result<pid_t> KeeperClient::KeeperPid() {
  BATON_ASSIGN_OR_RETURN(proto::PeerCredentials peer, channel_->peer_credentials());
  return peer.pid;
}

Status KeeperClient::Keep(const std::string& name, const std::string& manifest,
                          const std::vector<int>& fds) {
  BATON_ASSIGN_OR_RETURN(auto answer,
                         Request(proto::KeepMemory{.name = name, .manifest = manifest}, fds));
  if (!answer.first.found) return Internal("baton-keeper did not keep '" + name + "'");
  return OkStatus();
}

Result<std::optional<KeptItem>> KeeperClient::Fetch(const std::string& name) {
  BATON_ASSIGN_OR_RETURN(auto answer, Request(proto::FetchMemory{.name = name}, {}));
  if (!answer.first.found) return std::optional<KeptItem>();
  return std::optional<KeptItem>(
      KeptItem{.manifest = std::move(answer.first.manifest), .fds = std::move(answer.second)});
}

Status KeeperClient::Release(const std::string& name) {
  return Request(proto::ReleaseMemory{.name = name}, {}).status();
}

Result<bool> KeeperClient::Forget(const std::string& name) {
  if (name.empty()) return InvalidArgument("Forget(\"\") would end the keeper");
  BATON_ASSIGN_OR_RETURN(auto answer, Request(proto::ReleaseMemory{.name = name}, {}));
  return answer.first.found;
}

}  // namespace baton
