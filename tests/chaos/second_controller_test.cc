// A second controller started by mistake beside a running one: on its runtime directory it is
// refused before it touches anything there (the engines' cgroups, baton-keeper, the socket),
// whatever its state directory; on its state directory alone, before it makes cgroups of its
// own. The running pair goes on, and a restart of the running controller still re-adopts
// everything. Real processes; every check goes through batonctl.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/controller_restart_support.h"
#include "tests/chaos/router_stream_support.h"

namespace baton::chaos {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs a second baton-controller on the cluster's config with `overrides`
// ("--section.key=VALUE"); returns its exit status and its log.
std::pair<int, std::string> RunSecondController(const ChaosCluster& cluster,
                                                const std::vector<std::string>& overrides) {
  const std::string log = cluster.dir() + "/second-controller.log";
  std::vector<std::string> argv = {std::string(BATON_BIN_DIR) + "/baton-controller", "--config",
                                   cluster.dir() + "/controller.toml"};
  argv.insert(argv.end(), overrides.begin(), overrides.end());
  Child second(argv, log, /*piped=*/false);
  EXPECT_TRUE(second.started());
  const int code = second.Wait(std::chrono::seconds(20));
  return {code, ReadFile(log)};
}

void ExpectThePairUntouched(ChaosCluster& cluster, const json& before) {
  const json now = cluster.Status();
  EXPECT_TRUE(SamePair(before, now)) << "the same engines, alive: " << now.dump();
  // The running controller's memory is still what baton-keeper keeps: a restart adopts it
  // with the same engines.
  cluster.KillController();
  cluster.RestartController();
  const json after = cluster.WaitFor([&](const json& s) { return SamePair(before, s); },
                                     "the same pair, re-adopted");
  ExpectAdoptedMemory(after);
  EXPECT_TRUE(after["controller"]["recovery"]["fenced"].empty()) << after["controller"].dump();
  ExpectHealthy(cluster, after);
}

TEST(SecondController, OnTheSameRuntimeDirectoryIsRefusedBeforeItTouchesAnything) {
  ChaosCluster cluster;
  const json before = cluster.WaitReady();
  const auto [code, log] =
      RunSecondController(cluster, {"--controller.state_dir=" + cluster.dir() + "/other-state"});
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("runtime directory " + cluster.dir() +
                     "/run is in use by another process "
                     "(pid " +
                     std::to_string(cluster.controller_pid()) + " holds"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("killed"), std::string::npos) << "it killed nothing: " << log;
  EXPECT_EQ(log.find("keeper"), std::string::npos) << "it never reached baton-keeper: " << log;
  ExpectThePairUntouched(cluster, before);
}

TEST(SecondController, OnTheSameStateDirectoryIsRefusedBeforeItMakesCgroups) {
  ChaosCluster cluster;
  const json before = cluster.WaitReady();
  const auto [code, log] =
      RunSecondController(cluster, {"--controller.runtime_dir=" + cluster.dir() + "/other-run",
                                    "--controller.state_dir=" + cluster.dir() + "/run/state"});
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("epoch journal " + cluster.dir() +
                     "/run/state/epoch.journal is in use by "
                     "another process"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("cgroup"), std::string::npos) << "it made no cgroups: " << log;
  ExpectThePairUntouched(cluster, before);
}

}  // namespace
}  // namespace baton::chaos
