// Free TCP ports for the servers tests start (routers, engines, metrics servers, etcd,
// Prometheus). A port is drawn below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), which neither an outgoing connection nor a bind to port 0
// takes: a port the kernel picked and released is the next one a test beside this one (or a
// connection of its) may get before the server binds it, and is often held by closed
// connections in TIME_WAIT, which a server's bind conflicts with even with SO_REUSEADDR.
//
// Header-only test support; thread-safe.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>

#include "base/io/unique_fd.h"

namespace baton::testing_support {

// Whether `ip`:`port` can be bound now, with SO_REUSEADDR as the project's servers bind
// (proto/http/http_server.cc).
inline bool PortFree(int port, const std::string& ip = "127.0.0.1") {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int on = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, ip.c_str(), &at.sin_addr) != 1) return false;
  return ::bind(fd.get(), reinterpret_cast<sockaddr*>(&at), sizeof(at)) == 0;
}

// The first of `n` consecutive ports free on `ip` now, drawn at random in [10000, the
// ephemeral range's start); 0 when none was found.
inline int FreePorts(int n, const std::string& ip = "127.0.0.1") {
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  const int first = 10000;
  const int last = std::min(low, 65536) - n;
  if (last <= first) return 0;
  thread_local std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(first, last);
  for (int tries = 0; tries < 500; ++tries) {
    const int base = pick(rng);
    bool all = true;
    for (int i = 0; all && i < n; ++i) all = PortFree(base + i, ip);
    if (all) return base;
  }
  return 0;
}

// One port free on `ip` now, or 0.
inline int FreePort(const std::string& ip = "127.0.0.1") { return FreePorts(1, ip); }

}  // namespace baton::testing_support
