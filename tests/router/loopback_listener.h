// LoopbackListener: a TCP socket listening on an ephemeral 127.0.0.1 port, for the scripted
// backends and relays of the router tests. Connections wait in its backlog until accepted,
// so a listener nobody accepts from is a backend that never answers. port() is 0 if it could
// not bind. Shutdown() makes a blocked accept() return. Test support (header-only).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

#include "base/io/unique_fd.h"

namespace baton {

class LoopbackListener {
 public:
  LoopbackListener() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::listen(fd_.get(), 64) == 0 &&
        ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  uint16_t port() const { return port_; }
  int fd() const { return fd_.get(); }
  void Shutdown() { ::shutdown(fd_.get(), SHUT_RDWR); }

 private:
  UniqueFd fd_;
  uint16_t port_ = 0;
};

}  // namespace baton
