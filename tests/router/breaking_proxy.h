// BreakingProxy: a loopback TCP relay in front of a backend that cuts the first
// `connections_to_break` connections after `cut_after` bytes of the backend's answer, the
// way an engine that dies mid-response looks to the router. Later connections are relayed
// whole. Test support (header-only); each connection is served by its own thread.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "base/io/unique_fd.h"
#include "tests/router/loopback_listener.h"

namespace baton {

class BreakingProxy {
 public:
  BreakingProxy(uint16_t backend_port, size_t cut_after, int connections_to_break)
      : backend_port_(backend_port), cut_after_(cut_after), to_break_(connections_to_break) {
    if (listener_.port() == 0) return;
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~BreakingProxy() {
    stopping_ = true;
    listener_.Shutdown();
    if (acceptor_.joinable()) acceptor_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : relays_) t.join();
  }
  uint16_t port() const { return listener_.port(); }
  int connections() const { return accepted_.load(); }
  int broken() const { return broken_.load(); }

 private:
  static sockaddr_in Loopback(uint16_t port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    return addr;
  }

  void Accept() {
    while (!stopping_) {
      UniqueFd client(::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!client.valid()) return;
      const bool cut = accepted_.fetch_add(1) < to_break_;
      std::lock_guard<std::mutex> lock(mu_);
      relays_.emplace_back(
          [this, c = std::move(client), cut]() mutable { Relay(std::move(c), cut); });
    }
  }

  void Relay(UniqueFd client, bool cut) {
    UniqueFd backend(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr = Loopback(backend_port_);
    if (::connect(backend.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    size_t answered = 0;
    char buf[4096];
    pollfd fds[2] = {{client.get(), POLLIN, 0}, {backend.get(), POLLIN, 0}};
    while (!stopping_) {
      if (::poll(fds, 2, 100) < 0) return;
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = ::recv(client.get(), buf, sizeof(buf), 0);
        if (n <= 0) return;
        (void)!::send(backend.get(), buf, static_cast<size_t>(n), MSG_NOSIGNAL);
      }
      if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = ::recv(backend.get(), buf, sizeof(buf), 0);
        if (n <= 0) return;
        if (cut && answered + static_cast<size_t>(n) >= cut_after_) {
          (void)!::send(client.get(), buf, cut_after_ - answered, MSG_NOSIGNAL);
          ++broken_;
          return;  // both sockets close: the "engine" died mid-answer
        }
        answered += static_cast<size_t>(n);
        (void)!::send(client.get(), buf, static_cast<size_t>(n), MSG_NOSIGNAL);
      }
    }
  }

  const uint16_t backend_port_;
  const size_t cut_after_;
  const int to_break_;
  LoopbackListener listener_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> broken_{0};
  std::mutex mu_;
  std::vector<std::thread> relays_;
  std::thread acceptor_;
};

}  // namespace baton
