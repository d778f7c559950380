#include "base/io/service_watchdog.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstring>
#include <string>

#include "base/io/unique_fd.h"

namespace baton {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// The service manager's end: a datagram socket bound to an abstract name (nothing to remove).
class Manager {
 public:
  Manager() : name_("@baton-watchdog-test-" + std::to_string(::getpid())) {
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path + 1, name_.data() + 1, name_.size() - 1);
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size());
    bound_ = ::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&a), len) == 0;
  }
  bool bound() const { return bound_; }
  const std::string& name() const { return name_; }
  // Every datagram waiting now, joined by '\n'.
  std::string Drain() {
    std::string all;
    char buf[512];
    for (ssize_t n; (n = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT)) > 0;) {
      all.append(buf, static_cast<size_t>(n)).push_back('\n');
    }
    return all;
  }

 private:
  std::string name_;
  UniqueFd fd_;
  bool bound_ = false;
};

class ServiceWatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(manager_.bound());
    Result<SdNotifier> n = SdNotifier::ForSocket(manager_.name(), microseconds(3'000'000));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    watchdog_ = std::make_unique<ServiceWatchdog>(io_, std::move(*n), clock_, "router");
  }

  Manager manager_;
  boost::asio::io_context io_;
  FakeClock clock_;
  std::unique_ptr<ServiceWatchdog> watchdog_;
};

TEST_F(ServiceWatchdogTest, ReadyThenAPingFromEachRunOfTheLoop) {
  watchdog_->Start("listening");
  EXPECT_EQ(manager_.Drain(), "READY=1\nSTATUS=listening\n");
  clock_.Advance(milliseconds(100));
  ASSERT_EQ(io_.run_one(), 1u);
  EXPECT_EQ(manager_.Drain(), "WATCHDOG=1\n");
  clock_.Advance(milliseconds(100));
  ASSERT_EQ(io_.run_one(), 1u);
  EXPECT_EQ(manager_.Drain(), "WATCHDOG=1\n");
  EXPECT_NE(watchdog_->Metrics().find("\nbaton_router_loop_delay_ms 0\n"), std::string::npos)
      << watchdog_->Metrics();
  EXPECT_NE(watchdog_->Metrics().find("\nbaton_router_watchdog_seconds 3\n"), std::string::npos)
      << watchdog_->Metrics();
}

// The loop's delay is how late the timer ran by the injected clock: a loop held up (a frozen
// process, a stuck handler) shows as one late run, and the largest is kept.
TEST_F(ServiceWatchdogTest, ALateRunIsMeasuredByTheClock) {
  watchdog_->Start("listening");
  clock_.Advance(milliseconds(600));  // due at +100 ms: 500 ms late
  ASSERT_EQ(io_.run_one(), 1u);
  clock_.Advance(milliseconds(100));  // on time
  ASSERT_EQ(io_.run_one(), 1u);
  const std::string m = watchdog_->Metrics();
  EXPECT_NE(m.find("\nbaton_router_loop_delay_ms 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("\nbaton_router_loop_delay_max_ms 500\n"), std::string::npos) << m;
}

TEST_F(ServiceWatchdogTest, NoPingAfterStopping) {
  watchdog_->Start("listening");
  (void)manager_.Drain();
  watchdog_->Stopping();
  io_.run();  // the cancelled timer's handler, which arms nothing
  EXPECT_EQ(manager_.Drain(), "STOPPING=1\n");
}

}  // namespace
}  // namespace baton
