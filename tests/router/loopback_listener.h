// LoopbackListener: a TCP socket listening on an ephemeral 127.0.0.1 port, for the scripted
// backends and relays of the router tests. Connections wait in its backlog until accepted,
// so a listener nobody accepts from is a backend that never answers. port() is 0 if it could
// not bind. Shutdown() makes a blocked accept() return, and the port refuse connections.
//
// RefusedLoopbackPort: a 127.0.0.1 port bound but not listening, for a test that needs an
// engine that is gone: connections to it are refused for as long as it lives, and no other
// socket takes the port meanwhile (a port freed instead may be taken by a parallel test's
// listener). Only a socket that sets SO_REUSEPORT too may share it: LoopbackListener(held)
// listens on it, for an engine that dies during the test (after its Shutdown() the port
// refuses again). Test support (header-only).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

#include "base/io/unique_fd.h"

namespace baton {

namespace loopback_internal {

// Binds `fd` to 127.0.0.1:`port` (0: an ephemeral one), shared with other SO_REUSEPORT
// sockets when `reuse_port`, and listening when `listen`; the port bound, or 0.
inline uint16_t Bind(int fd, uint16_t port, bool reuse_port, bool listen) {
  const int one = 1;
  if (reuse_port && ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (listen && ::listen(fd, 64) != 0) ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return 0;
  }
  return ntohs(addr.sin_port);
}

}  // namespace loopback_internal

class RefusedLoopbackPort {
 public:
  RefusedLoopbackPort()
      : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)),
        port_(loopback_internal::Bind(fd_.get(), 0, /*reuse_port=*/true, /*listen=*/false)) {}
  uint16_t port() const { return port_; }

 private:
  UniqueFd fd_;
  uint16_t port_ = 0;
};

class LoopbackListener {
 public:
  LoopbackListener()
      : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)),
        port_(loopback_internal::Bind(fd_.get(), 0, /*reuse_port=*/false, /*listen=*/true)) {}
  // Listens on `held`'s port (0 when `held` has none), which refuses again after Shutdown().
  explicit LoopbackListener(const RefusedLoopbackPort& held)
      : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)),
        port_(held.port() == 0 ? 0
                               : loopback_internal::Bind(fd_.get(), held.port(),
                                                         /*reuse_port=*/true, /*listen=*/true)) {}
  uint16_t port() const { return port_; }
  int fd() const { return fd_.get(); }
  void Shutdown() { ::shutdown(fd_.get(), SHUT_RDWR); }

 private:
  UniqueFd fd_;
  uint16_t port_ = 0;
};

}  // namespace baton
