#include "base/io/service_watchdog.h"

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
                                 const Clock& clock, std::string name)
    : timer_(boost::asio::make_strand(io)),
      notifier_(std::move(notifier)),
      clock_(clock),
      name_(std::move(name)) {}

void ServiceWatchdog::Start(const std::string& what) {
  if (notifier_.enabled()) {
    const Status ready = notifier_.Notify("READY=1\nSTATUS=" + what);
    if (!ready.ok()) BATON_LOG(WARN, name_.c_str()) << ready.message();
    const auto period = notifier_.watchdog();
    BATON_LOG(INFO, name_.c_str())
        << "the service manager is told READY=1 at " << notifier_.socket_path()
        << (period ? "; watchdog " + std::to_string(period->count() / 1000) + " ms"
                   : std::string("; no watchdog"));
  }
  due_ = clock_.Now() + kPeriod;
  Arm();
}

void ServiceWatchdog::Stopping() {
  BATON_LOG(INFO, name_.c_str()) << "event loop: the longest delay of the liveness timer was "
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
    BATON_LOG(WARN, name_.c_str())
        << "the event loop ran " << last_delay_ms_ << " ms late"
        << (period
                ? " (the watchdog kills it past " + std::to_string(period->count() / 1000) + " ms)"
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
  const std::string prefix = "baton_" + name_;
  gauge((prefix + "_loop_delay_ms").c_str(),
        ("How late the " + name_ + "'s event loop ran its last liveness timer").c_str(),
        last_delay_ms_);
  gauge((prefix + "_loop_delay_max_ms").c_str(),
        ("The longest the " + name_ + "'s event loop was late for its liveness timer since start")
            .c_str(),
        max_delay_ms_);
  const auto period = notifier_.watchdog();
  gauge((prefix + "_watchdog_seconds").c_str(),
        "The service manager's watchdog timeout (WatchdogSec); 0 when none",
        period ? static_cast<double>(period->count()) / 1e6 : 0);
  return out.str();
}

}  // namespace baton
