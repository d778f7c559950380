#include "controller/service_watchdog.h"

#include <algorithm>
#include <sstream>

#include "base/log.h"
#include "base/text/metric_number.h"

namespace baton {
namespace {

// A stall this long delays failovers: worth a line in the log.
constexpr double kLateMs = 100;

}  // namespace

ServiceWatchdog::ServiceWatchdog(boost::asio::io_context& io, SdNotifier notifier,
                                 const Clock& clock)
    : timer_(io), notifier_(std::move(notifier)), clock_(clock) {}

void ServiceWatchdog::Start() {
  if (notifier_.enabled()) {
    const Status ready = notifier_.Notify("READY=1\nSTATUS=serving its socket");
    if (!ready.ok()) BATON_LOG(WARN, "controller") << ready.message();
    const auto period = notifier_.watchdog();
    BATON_LOG(INFO, "controller") << "the service manager is told READY=1 at "
                                  << notifier_.socket_path()
                                  << (period ? "; watchdog " +
                                                   std::to_string(period->count() / 1000) + " ms"
                                             : std::string("; no watchdog"));
  }
  due_ = clock_.Now() + kPeriod;
  Arm();
}

void ServiceWatchdog::Stopping() {
  BATON_LOG(INFO, "controller") << "event loop: the longest delay of the liveness timer was "
                                << max_delay_ms_ << " ms";
  stopping_ = true;
  timer_.cancel();
  (void)notifier_.Notify("STOPPING=1");
}

void ServiceWatchdog::Arm() {
  timer_.expires_after(due_ - clock_.Now());
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && !stopping_) OnTimer();
  });
}

void ServiceWatchdog::OnTimer() {
  const TimePoint now = clock_.Now();
  last_delay_ms_ = std::max(0.0, MillisBetween(due_, now));
  max_delay_ms_ = std::max(max_delay_ms_, last_delay_ms_);
  if (last_delay_ms_ > kLateMs) {
    const auto period = notifier_.watchdog();
    BATON_LOG(WARN, "controller") << "the event loop ran " << last_delay_ms_ << " ms late"
                                  << (period ? " (the watchdog kills it past " +
                                                   std::to_string(period->count() / 1000) + " ms)"
                                             : std::string());
  }
  if (notifier_.watchdog().has_value()) (void)notifier_.Notify("WATCHDOG=1");
  due_ = now + kPeriod;
  Arm();
}

std::string ServiceWatchdog::Metrics() const {
  std::ostringstream out;
  const auto gauge = [&](const char* name, const char* help, double v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
        << name << " " << MetricNumber(v) << "\n";
  };
  gauge("baton_controller_loop_delay_ms",
        "How late the controller's event loop ran its last liveness timer", last_delay_ms_);
  gauge("baton_controller_loop_delay_max_ms",
        "The longest the controller's event loop was late for its liveness timer since start",
        max_delay_ms_);
  const auto period = notifier_.watchdog();
  gauge("baton_controller_watchdog_seconds",
        "The service manager's watchdog timeout (WatchdogSec); 0 when none",
        period ? static_cast<double>(period->count()) / 1e6 : 0);
  return out.str();
}

}  // namespace baton
