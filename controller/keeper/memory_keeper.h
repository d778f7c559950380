// MemoryKeeper: the `baton-keeper` process. It holds file descriptors (the weight arena's and
// the pool's memfds; on the CUDA backend the device memory's chunk fds too) and a manifest for
// each, under a name, so that their memory outlives the
// controller that made it: a memfd lives while any process holds it or maps it. A controller
// that starts finds the keeper at <runtime_dir>/keeper.sock and takes the memory back
// (FetchMemory) instead of loading the model again; what it takes is its own to prove (the
// manifest says what the memory is; controller/kept_memory.h checks it).
//
// Who is served: the socket is the user's own (mode 0600), and of that user's processes only
// one that runs a program of `controllers` (/proc/PID/exe, read when its Hello arrives, with
// the process still alive then: SO_PEERPIDFD) and says it is the controller. Any other (an
// engine's process, a tool) is refused with the reason, so it can neither take the memory's
// fds (the device copy's included, which it could map writable) nor replace a manifest the
// next controller would trust. Not a sandbox: a process of the user that runs the
// controller's program itself (with a config of its own) is served.
//
// Protocol (proto/messages.h): Hello with role "controller", then any number of KeepMemory
// (with fds: replaces what is kept under the name), FetchMemory (answered with the fds, dups
// of the kept ones), ReleaseMemory (closes what is kept; the name "" closes everything and
// ends the keeper). Each request gets a KeptMemory answer. One connection at a time (the
// controller is the only client); a connection idle for `idle_timeout` is closed. The keeper
// ends by itself once it keeps nothing and no controller has connected for `empty_exit`.
// While it runs, <socket>.pid holds its pid (for operators and tests).
//
// It is deliberately small: no thread, no allocation of its own memory, no dependency beyond
// the protocol, so that it is not the part that fails. Thread: the caller's (Run blocks).
#pragma once

#include <boost/asio/io_context.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/io/unique_fd.h"
#include "base/status.h"
#include "proto/transport/listener.h"

namespace baton {

struct KeeperOptions {
  std::string socket_path;
  // The programs (absolute paths, as /proc/PID/exe names them) whose processes are served as
  // the controller; at least one.
  std::vector<std::string> controllers;
  Duration idle_timeout = std::chrono::seconds(10);  // an open connection without a request
  Duration empty_exit = std::chrono::seconds(60);    // keeping nothing, nobody connected
  // The host weights and pool, and on the CUDA backend the device memory in parts of 16
  // chunk fds each (a few hundred chunks of 256 MiB on a large GPU).
  size_t max_items = 1024;
};

class MemoryKeeper {
 public:
  // Binds the socket (refused when another keeper listens there); InvalidArgument without
  // `controllers`.
  static Result<MemoryKeeper> Bind(const KeeperOptions& options);

  MemoryKeeper(MemoryKeeper&&) = default;
  MemoryKeeper& operator=(MemoryKeeper&&) = default;

  // Serves until told to release everything, or until it is empty and idle (see above).
  void Run();

  // For tests: the names kept now.
  std::vector<std::string> names() const;

 private:
  struct Item {
    std::string manifest;
    std::vector<UniqueFd> fds;
  };
  MemoryKeeper(KeeperOptions options, std::unique_ptr<boost::asio::io_context> io,
               proto::Listener listener)
      : options_(std::move(options)), io_(std::move(io)), listener_(std::move(listener)) {}

  // Serves one connection until it closes; false once told to end.
  bool Serve(proto::Channel& channel);
  // OkStatus when the process behind `channel` runs one of options_.controllers and is alive.
  Status AdmitProcess(proto::Channel& channel) const;
  // Answers one request; false once told to end.
  bool Handle(proto::Channel& channel, proto::ReceivedMessage& msg);

  KeeperOptions options_;
  std::unique_ptr<boost::asio::io_context> io_;  // owns the socket's service; never run
  proto::Listener listener_;
  std::map<std::string, Item> items_;
};

}  // namespace baton
