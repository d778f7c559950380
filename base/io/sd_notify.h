// SdNotifier: the service manager's notification protocol (sd_notify(3)), spoken without
// libsystemd: each message is one datagram to the AF_UNIX socket that $NOTIFY_SOCKET names (a
// path, or an abstract name written with a leading '@'). A daemon sends READY=1 once it serves,
// WATCHDOG=1 from its healthy event loop at least every half watchdog period, STOPPING=1 when
// it begins to stop, and STATUS=<text> whenever it likes. Without $NOTIFY_SOCKET (not under
// systemd, or a unit that is not Type=notify) every call does nothing and succeeds.
//
// FromEnvironment() reads $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID once and removes
// them from the environment (as sd_notify's unset_environment does), so that processes the
// daemon starts later (engines, baton-keeper) do not speak for it. Call it before any thread
// starts. The watchdog period is honoured only when $WATCHDOG_PID is unset or names this
// process (sd_watchdog_enabled(3)).
//
// Owns its datagram socket (RAII). Thread-compatible: one thread calls Notify().
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "base/io/unique_fd.h"
#include "base/status.h"

namespace baton {

class SdNotifier {
 public:
  SdNotifier() = default;  // disabled
  static SdNotifier FromEnvironment();
  // For tests and tools: notifications to `socket_path` (a path or "@abstract"), with
  // `watchdog` as the period (nullopt: none).
  static Result<SdNotifier> ForSocket(const std::string& socket_path,
                                      std::optional<std::chrono::microseconds> watchdog);

  bool enabled() const { return fd_.valid(); }
  // The service manager's watchdog period, when it set one for this process.
  std::optional<std::chrono::microseconds> watchdog() const { return watchdog_; }
  const std::string& socket_path() const { return path_; }
  // Sends `state` ("READY=1", "WATCHDOG=1", "STATUS=...", several joined by '\n').
  Status Notify(std::string_view state) const;

 private:
  UniqueFd fd_;
  sockaddr_un addr_{};
  socklen_t addr_len_ = 0;
  std::string path_;
  std::optional<std::chrono::microseconds> watchdog_;
};

}  // namespace baton
