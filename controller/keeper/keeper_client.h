// KeeperClient: the controller's side of baton-keeper (memory_keeper.h). Connect() finds the
// keeper at the socket path, or starts one: `baton-keeper` beside the controller's own
// binary, detached (its own session, reparented away from the controller, no parent-death
// signal), so that it outlives the controller. A keeper that accepts the connection but does
// not answer is killed first and a new one started: what it keeps cannot be had from it, it
// would hold that memory beside the memory this controller makes anew, and the socket from a
// new keeper. One stopped (SIGSTOP, a debugger) is killed once it has not answered within a
// second; one that runs (slow, busy or deadlocked) is asked again until its grace has passed
// since the first try. One that refuses the Hello serves another controller program (the
// keeper serves only the program of the controller that started it, memory_keeper.h), or
// speaks no protocol version this controller does: it is killed too, and a new one started.
// A caller that may not start keepers only logs such a refusal, with the keeper's pid. Each call is
// one request and its answer over a blocking channel; all of them are short (a local socket, no
// disk). The keeper closes a connection idle for its idle timeout (memory_keeper.h), and a
// controller may hold one across a long weight load: a request that finds its connection closed
// connects again and is sent again, up to three tries in all (every request is idempotent).
//
// Ownership: the client owns its channel and an io_context that is never run. Thread: the
// caller's (the controller's io thread, at start-up and shutdown only).
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/io/unique_fd.h"
#include "base/status.h"
#include "proto/transport/channel.h"

namespace baton {

struct KeptItem {
  std::string manifest;
  std::vector<UniqueFd> fds;
};

class KeeperClient {
 public:
  // How long a keeper that runs but does not answer is asked again before it is killed. A
  // keeper answers Hello at once; on a loaded host (swapped out, starved of CPU) it may take
  // seconds. It serves one connection at a time, but its only client is a controller, and a
  // controller connects only once it holds the state directory's lock (the one before it is
  // gone, and its connection closed with it), so it is not kept busy by another. Past this, it
  // is taken as deadlocked: waiting longer would only delay this restart, which is cold anyway.
  static constexpr Duration kUnansweredGrace = std::chrono::seconds(5);
  // How long a hung keeper, killed, may take to be gone (the wait ends as soon as it is). One
  // still there keeps its listening socket, and the keeper started next refuses to replace
  // it: a loaded host may take more than a fraction of a second to run a killed process's
  // exit. A caller on a watchdog's clock passes less.
  static constexpr Duration kHungExitWait = std::chrono::seconds(2);

  // Connects to the keeper at `socket_path`; when none answers and `keeper_binary` is not
  // empty, starts it (log to `log_path`, or /dev/null) and waits up to `wait` for it. A keeper
  // that accepts but does not answer is then killed (see above), after `grace` when it runs,
  // and one that refuses at once; with no `keeper_binary` either is only reported
  // (DeadlineExceeded, FailedPrecondition); a killed one is awaited for `exit_wait` at most.
  static Result<KeeperClient> Connect(const std::string& socket_path,
                                      const std::string& keeper_binary, const std::string& log_path,
                                      Duration wait = std::chrono::seconds(3),
                                      Duration grace = kUnansweredGrace,
                                      Duration exit_wait = kHungExitWait);

  KeeperClient(KeeperClient&&) = default;
  // Lets go of this client's channel before its io_context.
  KeeperClient& operator=(KeeperClient&& other) noexcept;

  // Keeps `fds` (dups are sent) with `manifest` under `name`, replacing what was kept there.
  Status Keep(const std::string& name, const std::string& manifest, const std::vector<int>& fds);
  // What is kept under `name`; nullopt when nothing is.
  Result<std::optional<KeptItem>> Fetch(const std::string& name);
  // Closes what is kept under `name`; "" closes everything and the keeper exits.
  Status Release(const std::string& name);
  // Closes what is kept under `name` (not ""); whether anything was.
  Result<bool> Forget(const std::string& name);

  // The keeper's pid, as the kernel saw it when this client connected.
  Result<pid_t> KeeperPid();

  // The path of baton-keeper beside the running program ("" when it is not there).
  static std::string DefaultBinary();

 private:
  KeeperClient(std::string socket_path, std::unique_ptr<boost::asio::io_context> io,
               proto::Channel channel)
      : socket_path_(std::move(socket_path)),
        io_(std::move(io)),
        channel_(std::make_unique<proto::Channel>(std::move(channel))) {}
  // A connection whose keeper accepted it but did not answer its Hello, kept open: while it
  // is, the keeper the kernel names for it (SO_PEERCRED) is alive. The channel is reset
  // before its io_context is replaced.
  struct Unanswered {
    pid_t pid = 0;
    std::unique_ptr<boost::asio::io_context> io;
    std::unique_ptr<proto::Channel> channel;
  };
  // A keeper that refused this process's Hello (FailedPrecondition).
  struct Refusing {
    pid_t pid = 0;
    UniqueFd pidfd;  // names it, whatever its pid becomes
  };
  // A keeper that accepts but does not answer Hello within `hello_timeout` is hung: its
  // connection is put in `*hung` (when not null) and DeadlineExceeded returned. One that
  // refuses is put in `*refusing` (when not null) and its refusal returned.
  static Result<KeeperClient> TryConnect(const std::string& socket_path, Duration hello_timeout,
                                         Unanswered* hung = nullptr, Refusing* refusing = nullptr);
  // After `first` went unanswered: a client once the keeper answers, or DeadlineExceeded once
  // it was killed (stopped, or still running after `grace`) and awaited for `exit_wait` at
  // most, or the error that says it is gone.
  static Result<KeeperClient> AwaitUnanswered(const std::string& socket_path, Unanswered first,
                                              Duration grace, Duration exit_wait);
  // Sends `msg` with `fds` and returns the answer; again on a new connection when the keeper
  // had closed this one.
  template <typename Msg>
  Result<std::pair<proto::KeptMemory, std::vector<UniqueFd>>> Request(const Msg& msg,
                                                                      const std::vector<int>& fds);

  std::string socket_path_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<proto::Channel> channel_;
};

// Starts `binary --socket socket_path --controller PROGRAM` detached from the calling
// process, PROGRAM being the calling process's own: the keeper serves processes of it only.
Status StartDetachedKeeper(const std::string& binary, const std::string& socket_path,
                           const std::string& log_path);

}  // namespace baton
