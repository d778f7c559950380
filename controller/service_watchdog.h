// ServiceWatchdog: the controller's proof of life to whatever supervises it. A timer on the
// controller's io_context thread fires every 100 ms; each run sends WATCHDOG=1 through the
// SdNotifier (systemd's WatchdogSec, unit Type=notify; nothing outside systemd) and measures
// how late it ran: the event loop's delay. A controller whose loop stops (a deadlock, SIGSTOP,
// a syscall that never returns) stops pinging; systemd then kills it (the shipped unit sets
// WatchdogSignal=SIGKILL) and Restart=always starts a new one, which re-adopts the engines and
// promotes the standby if the primary died meanwhile. `make serve` asks the same loop through
// batonctl (scripts/serve).
//
// A run more than 100 ms late is logged (WARN); Stopping() logs the longest delay. Metrics():
// baton_controller_loop_delay_ms (the last run's lateness),
// baton_controller_loop_delay_max_ms (the largest since start: what the default watchdog
// timeout is chosen from, docs/operations.md) and baton_controller_watchdog_seconds (the
// supervisor's timeout, 0 when none).
//
// Owned by the controller's main; thread: the io_context thread (Metrics() too: the metrics
// server calls it there).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <string>

#include "base/clock.h"
#include "base/io/sd_notify.h"

namespace baton {

class ServiceWatchdog {
 public:
  static constexpr Duration kPeriod = std::chrono::milliseconds(100);

  ServiceWatchdog(boost::asio::io_context& io, SdNotifier notifier, const Clock& clock);
  // READY=1 (the controller serves its socket), then a ping every kPeriod.
  void Start();
  // STOPPING=1; no ping after it.
  void Stopping();
  std::string Metrics() const;

 private:
  void Arm();
  void OnTimer();

  boost::asio::steady_timer timer_;
  SdNotifier notifier_;
  const Clock& clock_;
  TimePoint due_{};
  double last_delay_ms_ = 0;
  double max_delay_ms_ = 0;
  bool stopping_ = false;
};

}  // namespace baton
