// ServiceWatchdog: a daemon's proof of life to whatever supervises it (baton-controller's and
// baton-router's). A timer on the daemon's io_context fires every 100 ms; each run sends
// WATCHDOG=1 through the SdNotifier (systemd's WatchdogSec, unit Type=notify; nothing outside
// systemd) and measures how late it ran: the event loop's delay. A daemon whose loop stops (a
// deadlock, SIGSTOP, a syscall that never returns) stops pinging; systemd then kills it (the
// shipped units set WatchdogSignal=SIGKILL) and Restart=always starts a new one: a controller
// re-adopts the engines and promotes the standby if the primary died meanwhile, a router gets
// its route table again. `make serve` asks the same loops (scripts/serve): the controller's
// through batonctl, the router's through its /health.
//
// `name` ("controller", "router") names the log lines' component and the metrics. A run more
// than 100 ms late is logged (WARN); Stopping() logs the longest delay. Metrics():
// baton_<name>_loop_delay_ms (the last run's lateness), baton_<name>_loop_delay_max_ms (the
// largest since start: what the default watchdog timeout is chosen from, docs/operations.md)
// and baton_<name>_watchdog_seconds (the supervisor's timeout, 0 when none).
//
// Owned by the daemon's main (or the router). Its timer runs on a strand of the io_context (a
// router runs it on several threads): call Start(), Stopping() and Metrics() on executor()
// (the controller, whose io_context has one thread, calls them on that thread). The router
// exports no Metrics() (its delay shows in its log's "ran N ms late" lines).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <string>

#include "base/clock.h"
#include "base/io/sd_notify.h"

namespace baton {

class ServiceWatchdog {
 public:
  static constexpr Duration kPeriod = std::chrono::milliseconds(100);

  ServiceWatchdog(boost::asio::io_context& io, SdNotifier notifier, const Clock& clock,
                  std::string name);
  // READY=1 (the daemon serves: `what` says how, in STATUS=), then a ping every kPeriod.
  void Start(const std::string& what);
  // STOPPING=1; no ping after it.
  void Stopping();
  std::string Metrics() const;
  // The strand its timer and every call above run on.
  boost::asio::any_io_executor executor() { return timer_.get_executor(); }

 private:
  void Arm();
  void OnTimer();

  boost::asio::steady_timer timer_;
  SdNotifier notifier_;
  const Clock& clock_;
  const std::string name_;
  TimePoint due_{};
  double last_delay_ms_ = 0;
  double max_delay_ms_ = 0;
  bool stopping_ = false;
};

}  // namespace baton
