// Definitions of chaos_harness.h's status helpers, ports, processes and GateFile (included
// from it, after chaos_harness_inl.h).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {

// --- status helpers ---------------------------------------------------------------------------

inline json EngineWithRole(const json& status, const std::string& role) {
  if (!status.contains("engines")) return json();
  for (const json& e : status["engines"]) {
    if (e["role"] == role) return e;
  }
  return json();
}

inline uint64_t PrimaryId(const json& status) {
  const json p = EngineWithRole(status, "primary");
  return p.is_null() ? 0 : p["id"].get<uint64_t>();
}

inline json WaitNewPrimary(const ChaosCluster& cluster, uint64_t old_primary,
                           const std::string& what, std::chrono::seconds timeout) {
  return cluster.WaitFor([&](const json& s) { return IsReady(s) && PrimaryId(s) != old_primary; },
                         what, timeout);
}

inline pid_t PidOf(const json& engine) { return engine["pid"].get<pid_t>(); }

inline uint64_t Epoch(const json& status) { return status["epoch"]["durable"].get<uint64_t>(); }

inline bool IsReady(const json& status) {
  if (!status.contains("pair") || status["pair"]["state"] != "ready") return false;
  const json p = EngineWithRole(status, "primary");
  return !p.is_null() && p["serving"].get<bool>() && !EngineWithRole(status, "standby").is_null();
}

inline bool Settled(const json& status) {
  if (!IsReady(status) || status["pool"]["quarantined"] != 0) return false;
  const json& reserve = status["pool"]["promotion_reserve"];
  return reserve["available"] == reserve["target"];
}

inline int BlocksBesideTheReserve(const json& status) {
  return status["pool"]["blocks"].get<int>() -
         status["pool"]["promotion_reserve"]["target"].get<int>();
}

inline int FreeTcpPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

inline bool ProcessExists(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

inline GateFile::GateFile(const std::string& name)
    : path_("/tmp/baton-gate-" + std::to_string(::getpid()) + "-" + name) {
  Close();
}

inline void GateFile::Close() const {
  std::ofstream(path_) << "whatever waits on this gate waits while this file is here\n";
}

inline void GateFile::Open() const { ::unlink(path_.c_str()); }

}  // namespace baton::chaos
