// The chaos drills with engines written in Python on Baton's Python SDK (python/baton-engine,
// a ctypes binding of libbaton_engine.so): python/tests/sdk_engine.py registers, waits as a
// standby, and once promoted stamps its blocks' headers, checking that none was written by
// another engine. Each drill breaks the pair of two such engines and waits for it to be whole
// again; the fencing checks run as for the C++ test engine.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/switchover_support.h"

namespace baton::chaos {
namespace {

// The interpreter tests/CMakeLists.txt found (the first python3 with PyTorch, else any).
constexpr const char* kPython = BATON_TEST_PYTHON;

bool TorchInstalled() {
  return std::system((std::string(kPython) + " -c 'import torch' 2>/dev/null").c_str()) == 0;
}

ClusterOptions PythonPair() {
  ClusterOptions o;
  const std::string src = BATON_SOURCE_DIR;
  o.engine_wrapper = {"/usr/bin/env", "BATON_LIB_DIR=" + std::string(BATON_BIN_DIR) + "/../lib"};
  o.engine_command = {kPython, src + "/python/tests/sdk_engine.py", "--violations-dir",
                      "{runtime_dir}/../violations"};
  return o;
}

class PythonEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (*kPython == '\0' || ::access(kPython, X_OK) != 0) {
      GTEST_SKIP() << "no python3 was found when the build was configured";
    }
  }
};

TEST_F(PythonEngineTest, APairOfPythonEnginesServesAndReportsItsVersion) {
  ChaosCluster cluster(PythonPair());
  const json status = cluster.Status();
  const json primary = EngineWithRole(status, "primary");
  ASSERT_FALSE(primary.is_null()) << status.dump(2);
  EXPECT_EQ(primary["version"], "python-sdk-engine/1") << primary.dump(2);
  EXPECT_EQ(status["pool"]["granted"], BlocksBesideTheReserve(status));
  cluster.CheckFencing();
}

TEST_F(PythonEngineTest, KillPrimary) {
  ChaosCluster cluster(PythonPair());
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  WaitNewPrimary(cluster, primary["id"], "the Python standby to take over");
  const json after = cluster.WaitFor(Settled, "the old primary's blocks to move on");
  EXPECT_EQ(PrimaryId(after), standby["id"].get<uint64_t>());
  EXPECT_GT(Epoch(after), Epoch(before));
  EXPECT_EQ(after["pool"]["granted"], BlocksBesideTheReserve(after)) << "its blocks moved on";
  cluster.CheckFencing();
}

TEST_F(PythonEngineTest, HangIsDetectedAndFenced) {
  ChaosCluster cluster(PythonPair());
  const json primary = EngineWithRole(cluster.Status(), "primary");
  ASSERT_EQ(cluster.Ctl({"drill", "hang"}).exit_code, 0);
  WaitNewPrimary(cluster, primary["id"], "the hung Python primary to be replaced");
  EXPECT_FALSE(ProcessExists(PidOf(primary)));
  cluster.CheckFencing();
}

TEST_F(PythonEngineTest, ErrorReportFencesAtOnce) {
  ChaosCluster cluster(PythonPair());
  const json primary = EngineWithRole(cluster.Status(), "primary");
  ASSERT_EQ(cluster.Ctl({"drill", "error"}).exit_code, 0);
  WaitNewPrimary(cluster, primary["id"], "the Python primary's error report to fail over");
  const json t = cluster.Ctl({"timeline"}).out["timeline"];
  EXPECT_NE(t["cause"].get<std::string>().find("error"), std::string::npos) << t.dump(2);
  cluster.CheckFencing();
}

TEST_F(PythonEngineTest, GracefulSwitchoverDrainsThroughTheSdk) {
  ChaosCluster cluster(PythonPair());
  const json before = cluster.Status();
  const json primary = EngineWithRole(before, "primary");
  const json standby = EngineWithRole(before, "standby");
  SwitchOver(cluster);
  cluster.CheckFencing();
  // A switch-over's drain has a next primary; `batonctl drain`'s has none (ABI 9).
  ASSERT_EQ(cluster.Ctl({"drain"}).exit_code, 0);
  cluster.WaitFor([](const json& s) { return s["pair"]["state"] == "stopped"; }, "the drain");
  const std::string log = cluster.Log();
  EXPECT_NE(log.find("sdk engine " + std::to_string(primary["id"].get<uint64_t>()) +
                     ": drain: a next primary follows"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("sdk engine " + std::to_string(standby["id"].get<uint64_t>()) +
                     ": drain: no next primary follows"),
            std::string::npos)
      << log;
}

// A weight arena partly on huge pages (two memfds): the Python SDK maps both back to back,
// and every tensor it is given reads the bytes of the model's files, across the split too
// (sdk_engine.py --model-dir; a mismatch is a violation). After a kill, the new standby maps
// it the same way.
TEST_F(PythonEngineTest, APartialHugePageArenaReadsTheModelsBytes) {
  if (HugePagesFree() < 4) {
    GTEST_SKIP() << "needs free 2 MiB huge pages (HugePages_Free is " << HugePagesFree() << ")";
  }
  ClusterOptions o = PythonPair();
  o.model_dir = FiveMiBModelDir();
  o.weights_max_huge_pages = 1;
  o.engine_command.insert(o.engine_command.end(), {"--model-dir", "{model_dir}"});
  ChaosCluster cluster(o);
  const json status = cluster.Status();
  ASSERT_EQ(status["weights"]["huge_bytes"], 2u << 20) << status["weights"].dump();
  ASSERT_GT(status["weights"]["small_bytes"].get<uint64_t>(), 0u) << status["weights"].dump();
  const json primary = EngineWithRole(status, "primary");
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  WaitNewPrimary(cluster, primary["id"], "the Python standby to take over");
  cluster.WaitFor(IsReady, "a new Python standby on the partial arena");
  cluster.CheckFencing();  // a tensor that read other bytes than the file's is a violation file
}

TEST_F(PythonEngineTest, TorchViewsOfTheWeightsAndBlocksAreBatonsMemory) {
  if (!TorchInstalled()) GTEST_SKIP() << "PyTorch is missing for " << kPython;
  ClusterOptions o = PythonPair();
  o.engine_command.insert(o.engine_command.end(), {"--torch-model-dir", "{model_dir}"});
  o.register_timeout_ms = 60'000;  // engines that import torch, beside the suite's tests
  o.ready_timeout = std::chrono::seconds(90);
  ChaosCluster cluster(o);
  const json primary = EngineWithRole(cluster.Status(), "primary");
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  WaitNewPrimary(cluster, primary["id"], "the Python standby, its views checked, to take over",
                 std::chrono::seconds(60));
  cluster.CheckFencing();  // a view that was not the arena or the block is a violation file
}

}  // namespace
}  // namespace baton::chaos
