// The chaos tests' engines that reach for more than an engine's part (the rogue modes of
// test_engine_helper_main.cc): command-controller (the engine speaks to the controller as
// batonctl and as a router, runs batonctl from a worker in a session of its own, and speaks
// over a connection a child made before it exited) and
// lend-token (the engine hands its launch token to another process before it says Hello).
// Header-only test support.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "base/io/self_exe.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "standby/sdk/engine_sdk.h"

namespace baton::testing {

// "served" or "refused (why)": what the controller said to a Hello as `role`.
inline std::string TryRole(const std::string& socket, proto::PeerRole role) {
  boost::asio::io_context io;
  Result<proto::Channel> channel = proto::Connect(io, socket);
  if (!channel.ok()) return "no connection (" + channel.status().message() + ")";
  Result<proto::HelloAck> ack =
      proto::ClientHello(*channel, {.peer_name = "rogue", .role = role, .launch_token = ""});
  return ack.ok() ? "served" : "refused (" + ack.status().message() + ")";
}

// Connects in a child that exits at once, then says Hello as cli over the connection the child
// made: SO_PEERCRED names the child, which is gone by then. "served" or "refused (why)".
inline std::string TryCliThroughAGoneProcess(const std::string& socket) {
  boost::asio::io_context io;
  boost::asio::local::stream_protocol::socket s(io);
  s.open();
  const pid_t child = ::fork();
  if (child == 0) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
    ::_exit(::connect(s.native_handle(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  }
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    return "no connection";
  }
  proto::Channel channel(std::move(s));
  Result<proto::HelloAck> ack = proto::ClientHello(
      channel, {.peer_name = "rogue", .role = proto::PeerRole::kCli, .launch_token = ""});
  return ack.ok() ? "served" : "refused (" + ack.status().message() + ")";
}

// Runs `batonctl drain` in a session of its own; "exit N: what it printed".
inline std::string DrainFromAWorker(const std::string& socket, const std::string& out_file) {
  const std::string command = "setsid -w '" + SelfExeDir() + "/batonctl' --socket '" + socket +
                              "' drain > '" + out_file + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(out_file);
  std::string printed(std::istreambuf_iterator<char>(in), {});
  while (!printed.empty() && printed.back() == '\n') printed.pop_back();
  return "exit " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ": " + printed;
}

// Writes <dir>/command-<id>.txt, one line per attempt, and a violation when one was served.
inline void CommandController(const std::string& violations_dir, const EngineLaunchInfo& info) {
  const std::string dir = violations_dir + "/..";
  const std::string id = std::to_string(info.engine_id);
  const std::string cli = TryRole(info.socket_path, proto::PeerRole::kCli);
  const std::string router = TryRole(info.socket_path, proto::PeerRole::kRouter);
  const std::string drain = DrainFromAWorker(info.socket_path, dir + "/batonctl-" + id + ".out");
  const std::string gone = TryCliThroughAGoneProcess(info.socket_path);
  const std::string report = "cli: " + cli + "\nrouter: " + router +
                             "\nbatonctl drain from a worker: " + drain +
                             "\ncli through a process that is gone: " + gone + "\n";
  if (cli == "served" || router == "served" || gone == "served" || drain.rfind("exit 0", 0) == 0) {
    std::ofstream(violations_dir + "/violation-" + id + ".txt")
        << "an engine commanded the controller:\n"
        << report;
  }
  std::ofstream(dir + "/command-" + id + ".txt.tmp") << report;
  std::filesystem::rename(dir + "/command-" + id + ".txt.tmp", dir + "/command-" + id + ".txt");
}

// Writes "<pid> <launch token>" to <dir>/token-<id> and waits (up to 60 s) until someone
// removes it.
inline void LendToken(const std::string& violations_dir, const EngineLaunchInfo& info) {
  const std::string path = violations_dir + "/../token-" + std::to_string(info.engine_id);
  std::ofstream(path + ".tmp") << ::getpid() << " " << info.launch_token << "\n";
  std::filesystem::rename(path + ".tmp", path);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::filesystem::exists(path) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace baton::testing
