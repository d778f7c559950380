// A controller starts only in a runtime directory of its own (base/io/private_dir.h): one that
// another user made, or a symbolic link, is refused before its lock file is written; a lock
// file that is a symbolic link is refused, the file it points to left as it was.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/clock.h"
#include "controller/controller.h"

namespace baton {
namespace {

class ControllerPrivateDirsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/baton-private-dirs-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Init stops at its first step: nothing of the model or the engine is reached.
  Status Start(const std::string& runtime_dir) {
    ControllerConfig config;
    config.runtime_dir = runtime_dir;
    config.state_dir = dir_ + "/state";
    config.model_dir = dir_ + "/no-model";
    config.engine_command = {"/bin/false"};
    boost::asio::io_context io;
    FakeClock clock;
    Result<std::unique_ptr<Controller>> c = Controller::Create(io, config, clock);
    EXPECT_FALSE(c.ok()) << "the controller must not start";
    return c.ok() ? OkStatus() : c.status();
  }
  bool Has(const Status& s, const std::string& text) {
    return s.message().find(text) != std::string::npos;
  }

  std::string dir_;
};

TEST_F(ControllerPrivateDirsTest, ARuntimeDirectoryOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown a directory to another user";
  const std::string run = dir_ + "/run";
  ASSERT_EQ(::mkdir(run.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(run.c_str(), 0777), 0);
  ASSERT_EQ(::chown(run.c_str(), 65534, 65534), 0);
  const Status s = Start(run);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s, "runtime directory " + run + " is owned by uid 65534 (mode 0777)"))
      << s.ToString();
  EXPECT_TRUE(Has(s, "set controller.runtime_dir")) << s.ToString();
  EXPECT_FALSE(std::filesystem::exists(run + "/controller.lock"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/state"));
}

TEST_F(ControllerPrivateDirsTest, ARuntimeDirectoryThatIsASymbolicLinkIsRefused) {
  const std::string real = dir_ + "/real";
  const std::string run = dir_ + "/run";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), run.c_str()), 0);
  const Status s = Start(run);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s, "runtime directory " + run + " is a symbolic link")) << s.ToString();
  EXPECT_FALSE(std::filesystem::exists(real + "/controller.lock"));
}

TEST_F(ControllerPrivateDirsTest, ALockFileThatIsASymbolicLinkIsRefusedItsTargetUntouched) {
  const std::string run = dir_ + "/run";
  const std::string victim = dir_ + "/victim";
  ASSERT_EQ(::mkdir(run.c_str(), 0700), 0);
  std::ofstream(victim) << "precious\n";
  ASSERT_EQ(::symlink(victim.c_str(), (run + "/controller.lock").c_str()), 0);
  const Status s = Start(run);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(s, run + "/controller.lock is a symbolic link: not followed")) << s.ToString();
  std::string kept;
  std::getline(std::ifstream(victim), kept);
  EXPECT_EQ(kept, "precious");
}

}  // namespace
}  // namespace baton
