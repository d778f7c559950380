// NotifySocket: the service manager's end of sd_notify(3) for tests: a datagram socket a
// controller started with NOTIFY_SOCKET (and WATCHDOG_USEC) sends READY=1, WATCHDOG=1 and
// STOPPING=1 to. With it a test supervises the controller as systemd's WatchdogSec does: it
// waits until the pings have stopped for the watchdog's timeout, then kills and restarts.
//
// Owns its socket and removes its path. Header-only test support; one thread.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>

#include "base/io/unique_fd.h"

namespace baton::chaos {

class NotifySocket {
 public:
  using Clock = std::chrono::steady_clock;

  explicit NotifySocket(std::string path) : path_(std::move(path)) {
    ::unlink(path_.c_str());
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    bound_ = ::bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~NotifySocket() { ::unlink(path_.c_str()); }

  bool bound() const { return bound_; }
  const std::string& path() const { return path_; }
  int readies() const { return readies_; }
  int pings() const { return pings_; }
  std::optional<Clock::time_point> last_ping() const { return last_ping_; }

  // Reads what arrives for up to `wait`; true when something did.
  bool Receive(std::chrono::milliseconds wait) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) return false;
    const std::string message(buf, static_cast<size_t>(n));
    if (message.find("READY=1") != std::string::npos) ++readies_;
    if (message.find("WATCHDOG=1") != std::string::npos) {
      ++pings_;
      last_ping_ = Clock::now();
    }
    return true;
  }

  // Waits until READY=1 and a ping have come (false after `limit`).
  bool WaitReadyAndPing(std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while ((readies_ == 0 || pings_ == 0) && Clock::now() < deadline) {
      Receive(std::chrono::milliseconds(50));
    }
    return readies_ > 0 && pings_ > 0;
  }

  // What systemd's watchdog does: returns once no ping has come for `timeout` (counting from
  // the last one), reading pings meanwhile; false if pings still come after `limit`.
  bool WaitSilence(std::chrono::milliseconds timeout, std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      Receive(std::chrono::milliseconds(20));
      if (last_ping_ && Clock::now() - *last_ping_ >= timeout) return true;
    }
    return false;
  }

 private:
  std::string path_;
  UniqueFd fd_;
  bool bound_ = false;
  int readies_ = 0;
  int pings_ = 0;
  std::optional<Clock::time_point> last_ping_;
};

}  // namespace baton::chaos
