#include "base/io/sd_notify.h"

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "base/log.h"

namespace baton {
namespace {

// $WATCHDOG_USEC when it is for this process: a positive number, and $WATCHDOG_PID unset or
// this pid.
std::optional<std::chrono::microseconds> WatchdogFromEnvironment() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr) return std::nullopt;
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr) {
    if (std::strtoll(pid, nullptr, 10) != ::getpid()) return std::nullopt;
  }
  char* end = nullptr;
  const long long us = std::strtoll(usec, &end, 10);
  if (end == usec || *end != '\0' || us <= 0) return std::nullopt;
  return std::chrono::microseconds(us);
}

}  // namespace

Result<SdNotifier> SdNotifier::ForSocket(const std::string& socket_path,
                                         std::optional<std::chrono::microseconds> watchdog) {
  SdNotifier n;
  n.path_ = socket_path;
  n.watchdog_ = watchdog;
  if (socket_path.empty() || socket_path.size() >= sizeof(n.addr_.sun_path)) {
    return InvalidArgument("NOTIFY_SOCKET: want a path or @name shorter than " +
                           std::to_string(sizeof(n.addr_.sun_path)) + " bytes, got \"" +
                           socket_path + "\"");
  }
  if (socket_path[0] != '/' && socket_path[0] != '@') {
    return InvalidArgument("NOTIFY_SOCKET: want an absolute path or @name, got \"" + socket_path +
                           "\"");
  }
  n.addr_.sun_family = AF_UNIX;
  std::memcpy(n.addr_.sun_path, socket_path.data(), socket_path.size());
  if (socket_path[0] == '@') n.addr_.sun_path[0] = '\0';  // an abstract name
  n.addr_len_ = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_path.size() +
                                       (socket_path[0] == '@' ? 0 : 1));
  n.fd_ = UniqueFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!n.fd_.valid()) return ErrnoStatus("socket(AF_UNIX, SOCK_DGRAM)", errno);
  return n;
}

SdNotifier SdNotifier::FromEnvironment() {
  const char* socket_path = std::getenv("NOTIFY_SOCKET");
  const std::optional<std::chrono::microseconds> watchdog = WatchdogFromEnvironment();
  const std::string path = socket_path != nullptr ? socket_path : "";
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("WATCHDOG_PID");
  if (path.empty()) return SdNotifier();
  Result<SdNotifier> n = ForSocket(path, watchdog);
  if (!n.ok()) {
    BATON_LOG(WARN, "sd_notify") << n.status().message() << ": the service manager hears nothing";
    return SdNotifier();
  }
  return std::move(n).value();
}

Status SdNotifier::Notify(std::string_view state) const {
  if (!fd_.valid()) return OkStatus();
  const ssize_t sent = ::sendto(fd_.get(), state.data(), state.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
                                reinterpret_cast<const sockaddr*>(&addr_), addr_len_);
  if (sent < 0) return ErrnoStatus("sd_notify to " + path_, errno);
  return OkStatus();
}

}  // namespace baton
