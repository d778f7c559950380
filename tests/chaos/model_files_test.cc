// Model files that go bad on disk while a pair serves from memory: a controller restart
// never turns them into an outage. When the files changed and no longer load, the kept
// weights (the ones the engines map) serve on, said in status and `baton_degraded`; a start
// that cannot go on leaves the previous controller's engines running for the next one; a
// first start on a broken model leaves no baton-keeper behind. Real processes, kill -9.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/controller_restart_support.h"
#include "tests/chaos/router_stream_support.h"

namespace baton::chaos {
namespace {

namespace fs = std::filesystem;

// A copy of the tiny model that the test may break; removed with the object.
class ModelCopy {
 public:
  ModelCopy() : dir_("/tmp/baton-chaos-model-copy-" + std::to_string(::getpid())) {
    fs::remove_all(dir_);
    fs::copy(TinyModelDir(), dir_, fs::copy_options::recursive);
  }
  ~ModelCopy() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }
  // The weights file cut to half its size: its header names data past the end.
  void Truncate() const {
    const std::string file = dir_ + "/model.safetensors";
    fs::resize_file(file, fs::file_size(file) / 2);
  }

 private:
  std::string dir_;
};

ClusterOptions On(const ModelCopy& model) {
  ClusterOptions options;
  options.model_dir = model.dir();
  return options;
}

// The restarted controller exits 1 and leaves the engines of `before` running.
void ExpectExitLeavingTheEngines(ChaosCluster& cluster, const json& before) {
  const int status = cluster.WaitControllerExit();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (pid_t pid : EnginePids(before)) EXPECT_TRUE(ProcessExists(pid)) << "engine " << pid;
}

bool Degraded(const json& status, const std::string& what) {
  for (const json& d : status["degraded"]) {
    if (d["what"] == what) return true;
  }
  return false;
}

TEST(ModelFiles, ChangedFilesThatDoNotLoadLeaveTheKeptWeightsServing) {
  ModelCopy model;
  ChaosCluster cluster(On(model));
  const json before = cluster.Status();
  EXPECT_TRUE(before["weights"]["files_differ"].is_null()) << before["weights"].dump();
  EXPECT_FALSE(Degraded(before, "weights_files")) << before.dump();
  cluster.KillController();
  model.Truncate();
  cluster.StartControllerAgain();
  const json after = cluster.WaitFor([&](const json& s) { return SamePair(before, s); },
                                     "the same pair, re-adopted over the kept weights");
  ExpectAdoptedMemory(after);
  const json& differ = after["weights"]["files_differ"];
  ASSERT_TRUE(differ.is_string()) << after["weights"].dump();
  EXPECT_NE(differ.get<std::string>().find("do not load"), std::string::npos) << differ;
  EXPECT_NE(differ.get<std::string>().find("model.safetensors"), std::string::npos) << differ;
  EXPECT_TRUE(Degraded(after, "weights_files")) << after["degraded"].dump();
  EXPECT_NE(cluster.CtlPlain({"status"}).stdout_text.find("degraded: weights_files: "),
            std::string::npos);
  ExpectHealthy(cluster, after);
  // The pair still fails over: the new standby maps the kept arena.
  ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
  const json failed_over = cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && PrimaryId(s) != PrimaryId(before); },
      "a failover over the kept weights");
  ExpectHealthy(cluster, failed_over);
}

// Nothing proves the kept weights (the memory record is gone) and the files do not load: the
// controller cannot start, and leaves the engines it found serving rather than killing them.
TEST(ModelFiles, AStartThatCannotGoOnLeavesTheRunningEnginesAlone) {
  ModelCopy model;
  ChaosCluster cluster(On(model));
  const json before = cluster.Status();
  cluster.KillController();
  model.Truncate();
  fs::remove(cluster.dir() + "/run/state/memory.json");
  cluster.StartControllerAgain();
  ExpectExitLeavingTheEngines(cluster, before);
  const std::string log = cluster.Log();
  EXPECT_NE(log.find("of the previous controller left running for the next one"), std::string::npos)
      << log;
  EXPECT_NE(log.find("rule: data-inside-file"), std::string::npos) << log;
}

// model.dir pointed at another folder whose files do not load: the kept weights are not
// served under its name; the start stops, leaving the running engines alone.
TEST(ModelFiles, AnotherFolderThatDoesNotLoadIsNoFallback) {
  ModelCopy model;
  ChaosCluster cluster(On(model));
  const json before = cluster.Status();
  cluster.KillController();
  const std::string other = model.dir() + "-other";
  fs::copy(model.dir(), other, fs::copy_options::recursive);
  fs::resize_file(other + "/model.safetensors", fs::file_size(other + "/model.safetensors") / 2);
  const std::string path = cluster.dir() + "/controller.toml";
  std::string config = ReadFile(path);
  const size_t at = config.find(model.dir());
  ASSERT_NE(at, std::string::npos);
  config.replace(at, model.dir().size(), other);
  std::ofstream(path) << config;
  cluster.StartControllerAgain();
  ExpectExitLeavingTheEngines(cluster, before);
  fs::remove_all(other);
  EXPECT_EQ(cluster.Log().find("the kept weights, as loaded before, serve on"), std::string::npos)
      << cluster.Log();
}

// A first start on a model that does not load: exit 1, and no baton-keeper is left keeping
// nothing.
TEST(ModelFiles, AFirstStartOnABrokenModelLeavesNoKeeper) {
  ModelCopy model;
  model.Truncate();
  ClusterOptions options = On(model);
  options.wait_ready = false;
  ChaosCluster cluster(options);
  const int status = cluster.WaitControllerExit();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status;
  for (int i = 0; i < 100 && cluster.KeeperPid() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(cluster.KeeperPid(), 0) << cluster.Log();
  EXPECT_NE(cluster.Log().find("baton-keeper keeps nothing: let go"), std::string::npos)
      << cluster.Log();
}

}  // namespace
}  // namespace baton::chaos
