#include "controller/engines/engine_logs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "base/io/unique_fd.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

class EngineLogsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/baton-engine-logs-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::app) << text;
  }
  std::string Read(const std::string& name) const {
    std::ifstream in(Path(name));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  boost::asio::io_context io_;
  std::string dir_;
};

TEST(EngineLogId, OnlyEngineLogsAndTheirCopies) {
  EXPECT_EQ(EngineLogId("engine-12.log"), 12u);
  EXPECT_EQ(EngineLogId("engine-12.log.1"), 12u);
  EXPECT_EQ(EngineLogId("engine-.log"), 0u);
  EXPECT_EQ(EngineLogId("engine-12.log.2"), 0u);
  EXPECT_EQ(EngineLogId("engine-12.txt"), 0u);
  EXPECT_EQ(EngineLogId("keeper.log"), 0u);
  EXPECT_EQ(EngineLogId("engine-99999999999999999999999.log"), 0u);  // not a uint64
  EXPECT_EQ(EngineLogId("engine-12.crash.log"), 12u);
  EXPECT_EQ(EngineLogId("engine-12.crash.log.1"), 12u);
  EXPECT_EQ(EngineLogId("engine-12.crash"), 0u);
  EXPECT_TRUE(IsCrashLog("engine-12.crash.log"));
  EXPECT_TRUE(IsCrashLog("engine-12.crash.log.1"));
  EXPECT_FALSE(IsCrashLog("engine-12.log"));
  EXPECT_FALSE(IsCrashLog("x.crash.log"));
}

// A log past max_bytes is copied to .1 and truncated in place; the engine's O_APPEND
// descriptor goes on writing at the new start; a log below the bound is left alone.
TEST_F(EngineLogsTest, RotationCopiesTruncatesAndTheEngineWritesOn) {
  UniqueFd engine(::open(Path("engine-1.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0640));
  ASSERT_TRUE(engine.valid());
  const std::string old_text(200, 'a');
  ASSERT_EQ(::write(engine.get(), old_text.data(), old_text.size()), 200);
  Write("engine-2.log", std::string(50, 'b'));
  EngineLogs logs(io_, dir_, 100, 8);
  EXPECT_EQ(logs.RotateNow(), 1u);
  EXPECT_EQ(logs.rotations(), 1u);
  EXPECT_EQ(Read("engine-1.log.1"), old_text);
  EXPECT_EQ(Read("engine-1.log"), "");
  EXPECT_EQ(Read("engine-2.log"), std::string(50, 'b'));
  EXPECT_FALSE(fs::exists(Path("engine-2.log.1")));
  ASSERT_EQ(::write(engine.get(), "next\n", 5), 5);
  EXPECT_EQ(Read("engine-1.log"), "next\n");  // no hole of 200 zero bytes before it

  EXPECT_EQ(EngineLogs(io_, dir_, 0, 8).RotateNow(), 0u) << "max_bytes 0 would rotate";
}

// Prune keeps the live engines' logs and the `keep` most recent ids; the rest go, with their
// copies. Other files are not touched.
TEST_F(EngineLogsTest, PruneKeepsTheLiveAndTheMostRecent) {
  for (int id : {1, 2, 3, 4, 5, 6}) Write("engine-" + std::to_string(id) + ".log", "x");
  Write("engine-1.log.1", "x");
  Write("engine-3.log.1", "x");
  Write("keeper.log", "x");
  EngineLogs logs(io_, dir_, 100, 2);
  logs.Prune({1});  // engine 1 lives on (a long-lived primary); 5 and 6 are the most recent
  EXPECT_TRUE(fs::exists(Path("engine-1.log")));
  EXPECT_TRUE(fs::exists(Path("engine-1.log.1")));
  for (const char* gone : {"engine-2.log", "engine-3.log", "engine-3.log.1", "engine-4.log"}) {
    EXPECT_FALSE(fs::exists(Path(gone))) << gone;
  }
  EXPECT_TRUE(fs::exists(Path("engine-5.log")));
  EXPECT_TRUE(fs::exists(Path("engine-6.log")));
  EXPECT_TRUE(fs::exists(Path("keeper.log")));
  EXPECT_EQ(logs.deleted(), 4u);

  EngineLogs none(io_, "", 100, 2);  // engines log to the controller's stdout: nothing to do
  none.Prune({});
  EXPECT_EQ(none.RotateNow(), 0u);
}

// A crashed engine's log and its copy are renamed apart; they outlast the launches after it
// (Prune's `keep`) and go only once `crash_keep` later crashes have logs kept.
TEST_F(EngineLogsTest, ACrashLogOutlastsTheLaunchesAfterItUpToCrashKeep) {
  Write("engine-1.log", "starting\nsegfault\n");
  Write("engine-1.log.1", "older\n");
  EngineLogs logs(io_, dir_, 100, 1, 2);
  EXPECT_EQ(logs.KeepCrashed(1), Path("engine-1.crash.log"));
  EXPECT_EQ(Read("engine-1.crash.log"), "starting\nsegfault\n");
  EXPECT_EQ(Read("engine-1.crash.log.1"), "older\n");
  EXPECT_FALSE(fs::exists(Path("engine-1.log")));
  EXPECT_EQ(logs.KeepCrashed(7), "") << "no log to keep";
  for (int id : {2, 3, 4}) Write("engine-" + std::to_string(id) + ".log", "x");
  logs.Prune({4});
  EXPECT_TRUE(fs::exists(Path("engine-1.crash.log")));
  EXPECT_TRUE(fs::exists(Path("engine-1.crash.log.1")));
  EXPECT_FALSE(fs::exists(Path("engine-2.log")));
  EXPECT_FALSE(fs::exists(Path("engine-3.log")));
  EXPECT_TRUE(fs::exists(Path("engine-4.log")));
  // Two later crashes: the oldest crash log goes.
  for (int id : {5, 6}) {
    Write("engine-" + std::to_string(id) + ".log", "x");
    ASSERT_FALSE(logs.KeepCrashed(static_cast<uint64_t>(id)).empty());
  }
  logs.Prune({4});
  EXPECT_FALSE(fs::exists(Path("engine-1.crash.log")));
  EXPECT_FALSE(fs::exists(Path("engine-1.crash.log.1")));
  EXPECT_TRUE(fs::exists(Path("engine-5.crash.log")));
  EXPECT_TRUE(fs::exists(Path("engine-6.crash.log")));

  // A crash log is not rotated, however long.
  Write("engine-6.crash.log", std::string(500, 'c'));
  EXPECT_EQ(logs.RotateNow(), 0u);
  EXPECT_EQ(Read("engine-6.crash.log").size(), 501u);

  EngineLogs apart_not(io_, dir_, 100, 1, 0);  // crash_keep 0: nothing renamed
  EXPECT_EQ(apart_not.KeepCrashed(4), "");
  EXPECT_TRUE(fs::exists(Path("engine-4.log")));
}

}  // namespace
}  // namespace baton
