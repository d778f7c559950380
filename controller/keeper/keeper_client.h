// KeeperClient: the controller's side of baton-keeper (memory_keeper.h). Connect() finds the
// keeper at the socket path, or starts one: `baton-keeper` beside the controller's own
// binary, detached (its own session, reparented away from the controller, no parent-death
// signal), so that it outlives the controller. A keeper that accepts the connection but does
// not answer within a second and is stopped (SIGSTOP, a debugger) is killed first: what it
// keeps cannot be had from it, and it would hold the socket from a new one. One that runs is
// left alone (it may be serving another connection). Each call is one request and its answer
// over a blocking channel; all of them are short (a local socket, no disk). The keeper closes a
// connection idle for its idle timeout (memory_keeper.h), and a controller may hold one across
// a long weight load: a request that finds its connection closed connects again and is sent
// again, up to three tries in all (every request is idempotent).
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
  // Connects to the keeper at `socket_path`; when none answers and `keeper_binary` is not
  // empty, starts it (log to `log_path`, or /dev/null) and waits up to `wait` for it.
  static Result<KeeperClient> Connect(const std::string& socket_path,
                                      const std::string& keeper_binary, const std::string& log_path,
                                      Duration wait = std::chrono::seconds(3));

  KeeperClient(KeeperClient&&) = default;
  KeeperClient& operator=(KeeperClient&&) = default;

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
  // A keeper that accepts but does not answer Hello within kHelloTimeout is hung: its pid is
  // put in `*hung` (when not null) and DeadlineExceeded returned.
  static Result<KeeperClient> TryConnect(const std::string& socket_path, pid_t* hung = nullptr);
  // Sends `msg` with `fds` and returns the answer; again on a new connection when the keeper
  // had closed this one.
  template <typename Msg>
  Result<std::pair<proto::KeptMemory, std::vector<UniqueFd>>> Request(const Msg& msg,
                                                                      const std::vector<int>& fds);

  std::string socket_path_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<proto::Channel> channel_;
};

// Starts `binary --socket socket_path` detached from the calling process.
Status StartDetachedKeeper(const std::string& binary, const std::string& socket_path,
                           const std::string& log_path);

}  // namespace baton
