#include "base/io/sd_notify.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "base/io/unique_fd.h"

namespace baton {
namespace {

using std::chrono::microseconds;

// The service manager's end: a datagram socket bound to a path, or to an abstract name when
// the path starts with '@'.
class Manager {
 public:
  explicit Manager(std::string path) : path_(std::move(path)) {
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path_.data(), path_.size());
    if (path_[0] == '@') a.sun_path[0] = '\0';
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path_.size() +
                                                 (path_[0] == '@' ? 0 : 1));
    if (path_[0] == '/') ::unlink(path_.c_str());
    bound_ = ::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&a), len) == 0;
  }
  ~Manager() {
    if (path_[0] == '/') ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  // The next datagram, or "" when none is waiting.
  std::string Next() {
    char buf[512];
    const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }

 private:
  std::string path_;
  UniqueFd fd_;
  bool bound_ = false;
};

std::string TempPath() { return "/tmp/baton-sdnotify-" + std::to_string(::getpid()) + ".sock"; }

TEST(SdNotifier, SendsEachStateAsOneDatagram) {
  Manager manager(TempPath());
  ASSERT_TRUE(manager.bound());
  Result<SdNotifier> n = SdNotifier::ForSocket(TempPath(), microseconds(3'000'000));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_TRUE(n->enabled());
  EXPECT_EQ(n->watchdog(), microseconds(3'000'000));
  ASSERT_TRUE(n->Notify("READY=1\nSTATUS=serving").ok());
  ASSERT_TRUE(n->Notify("WATCHDOG=1").ok());
  EXPECT_EQ(manager.Next(), "READY=1\nSTATUS=serving");
  EXPECT_EQ(manager.Next(), "WATCHDOG=1");
  EXPECT_EQ(manager.Next(), "");
}

TEST(SdNotifier, AbstractSocketName) {
  const std::string name = "@baton-sdnotify-" + std::to_string(::getpid());
  Manager manager(name);
  ASSERT_TRUE(manager.bound());
  Result<SdNotifier> n = SdNotifier::ForSocket(name, std::nullopt);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  ASSERT_TRUE(n->Notify("STOPPING=1").ok());
  EXPECT_EQ(manager.Next(), "STOPPING=1");
}

TEST(SdNotifier, BadSocketsAreRefusedAndAGoneManagerIsAnError) {
  EXPECT_FALSE(SdNotifier::ForSocket("relative.sock", std::nullopt).ok());
  EXPECT_FALSE(SdNotifier::ForSocket("", std::nullopt).ok());
  EXPECT_FALSE(SdNotifier::ForSocket("/" + std::string(200, 'x'), std::nullopt).ok());
  Result<SdNotifier> n = SdNotifier::ForSocket(TempPath() + ".absent", std::nullopt);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->Notify("WATCHDOG=1").ok());  // nobody listens there
}

TEST(SdNotifier, FromEnvironmentReadsAndClearsTheVariables) {
  Manager manager(TempPath());
  ASSERT_TRUE(manager.bound());
  ::setenv("NOTIFY_SOCKET", TempPath().c_str(), 1);
  ::setenv("WATCHDOG_USEC", "2500000", 1);
  ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  SdNotifier n = SdNotifier::FromEnvironment();
  EXPECT_TRUE(n.enabled());
  EXPECT_EQ(n.watchdog(), microseconds(2'500'000));
  EXPECT_EQ(std::getenv("NOTIFY_SOCKET"), nullptr) << "children would speak for the daemon";
  EXPECT_EQ(std::getenv("WATCHDOG_USEC"), nullptr);
  EXPECT_EQ(std::getenv("WATCHDOG_PID"), nullptr);
  ASSERT_TRUE(n.Notify("READY=1").ok());
  EXPECT_EQ(manager.Next(), "READY=1");

  // A watchdog meant for another process (WATCHDOG_PID) is not this one's.
  ::setenv("NOTIFY_SOCKET", TempPath().c_str(), 1);
  ::setenv("WATCHDOG_USEC", "2500000", 1);
  ::setenv("WATCHDOG_PID", "1", 1);
  EXPECT_FALSE(SdNotifier::FromEnvironment().watchdog().has_value());

  // Not under a service manager: nothing is sent, and that is not an error.
  SdNotifier none = SdNotifier::FromEnvironment();
  EXPECT_FALSE(none.enabled());
  EXPECT_TRUE(none.Notify("WATCHDOG=1").ok());
}

}  // namespace
}  // namespace baton
