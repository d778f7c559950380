// Registering an engine on a large weight arena on 4 KiB pages, with real processes: mapping
// and pre-faulting the arena takes longer than the hang timeout, and that is no hang. The
// engines keep heartbeating from the registration on (the SDK's heartbeat thread starts
// before it maps, and pre-faults in slices that never hold the mmap lock long), so the pair
// starts with no engine fenced as hung and fails over as usual; an engine that really hangs
// while registering is still fenced as hung, long before the registration timeout.
//
// The arena is the 1g preset in bf16 (1.07 GB), on 4 KiB pages (model.huge_pages = false);
// the hang timeout is heartbeat 50 ms x 4 misses + a 300 ms health probe, 500 ms: short of
// the pre-fault, yet room for a heartbeat thread that a loaded host leaves unscheduled for a
// while. On the 2-core machine this was written on, pre-faulting that arena takes 400-900 ms
// (longer under load).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "standby/mkmodel/model_presets.h"
#include "standby/mkmodel/model_writer.h"
#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {
namespace {

constexpr double kHangTimeoutMs = 50 * 4 + 300;

// The 1g preset in bf16, written once per test binary and removed at exit.
const std::string& LargeModelDir() {
  static const std::string* dir = [] {
    auto* path = new std::string("/tmp/baton-chaos-1g-" + std::to_string(::getpid()));
    Result<ModelSummary> written = WriteModel(PresetSpec("1g", DType::kBF16), *path);
    if (!written.ok()) ADD_FAILURE() << "writing the 1g model: " << written.status().ToString();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all("/tmp/baton-chaos-1g-" + std::to_string(::getpid()), ec);
    });
    return path;
  }();
  return *dir;
}

ClusterOptions FourKiBArena() {
  ClusterOptions o;
  o.model_dir = LargeModelDir();
  o.weights_huge_pages = false;
  o.heartbeat_ms = 50;
  o.heartbeat_misses = 4;
  o.probe_timeout_ms = 300;
  o.wait_ready = false;  // loading 1 GB takes longer than WaitReady's default wait
  return o;
}

// Engines fenced as hung, other than `killed`: a process killed with kill -9 exits only once the
// kernel has torn down its mappings (on 4 KiB pages that takes about 0.3 s per GB of arena on
// a 2-core machine), and until then it neither heartbeats nor closes its socket, so its death
// may be seen as a hang.
size_t HangFences(const std::string& log, pid_t killed = 0) {
  size_t n = 0;
  const std::string not_this = "(pid " + std::to_string(killed) + ",";
  for (size_t at = log.find("fenced: hung"); at != std::string::npos;
       at = log.find("fenced: hung", at + 1)) {
    const std::string line = log.substr(log.rfind('\n', at) + 1, at - log.rfind('\n', at));
    if (killed == 0 || line.find(not_this) == std::string::npos) ++n;
  }
  return n;
}

double LongestPrefaultMs(const json& status) {
  double longest = 0;
  for (const json& e : status["engines"]) {
    longest = std::max(longest, e.value("prefault_ms", 0.0));
  }
  return longest;
}

TEST(ChaosRegistration, AnArenaThatPrefaultsPastTheHangTimeoutRegistersAndFailsOver) {
  ChaosCluster cluster(FourKiBArena());
  const json ready =
      cluster.WaitFor(IsReady, "the pair on the 1 GB arena", std::chrono::seconds(180));
  ASSERT_TRUE(IsReady(ready)) << cluster.Log();
  EXPECT_FALSE(ready["weights"].value("huge_pages", true)) << ready["weights"].dump();
  const double prefault_ms = LongestPrefaultMs(ready);
  std::cout << "pre-fault of the 1 GB arena on 4 KiB pages: " << prefault_ms << " ms (hang timeout "
            << kHangTimeoutMs << " ms)" << std::endl;
  RecordProperty("prefault_ms", std::to_string(prefault_ms));
  EXPECT_EQ(HangFences(cluster.Log()), 0u) << cluster.Log();
  EXPECT_EQ(ready["crash_loop"]["total_failures"], 0) << ready["crash_loop"].dump();

  // A failover as usual: the standby takes over, and a new standby registers on the same
  // arena (pre-faulting it again) without being taken for hung either.
  const json primary = EngineWithRole(ready, "primary");
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  const json after = cluster.WaitFor(
      [&](const json& s) {
        return IsReady(s) && PrimaryId(s) != primary["id"].get<uint64_t>() &&
               s["controller"]["launches"].get<uint64_t>() >= 3;
      },
      "the standby promoted and a new standby registered", std::chrono::seconds(120));
  EXPECT_EQ(PrimaryId(after), EngineWithRole(ready, "standby")["id"].get<uint64_t>());
  EXPECT_EQ(HangFences(cluster.Log(), PidOf(primary)), 0u) << cluster.Log();
  EXPECT_LE(after["crash_loop"]["total_failures"], 1) << "the killed primary at most";
  cluster.CheckFencing();
}

TEST(ChaosRegistration, AnEngineThatHangsWhileRegisteringIsFencedAsHung) {
  ClusterOptions options = FourKiBArena();
  options.engine_args = {"--hang-registering-id", "2"};
  ChaosCluster cluster(options);
  cluster.WaitFor([&](const json&) { return HangFences(cluster.Log()) > 0; },
                  "engine 2 fenced as hung while registering", std::chrono::seconds(180));
  const std::string log = cluster.Log();
  const size_t at = log.find("fenced: hung");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line =
      log.substr(log.rfind('\n', at) + 1, log.find('\n', at) - log.rfind('\n', at));
  EXPECT_NE(line.find("engine 2 (pid "), std::string::npos) << line;
  EXPECT_NE(line.find(", registering) fenced: hung: no heartbeat"), std::string::npos) << line;
  // Its place is taken: the pair forms with a new standby.
  const json ready = cluster.WaitFor(IsReady, "a pair without engine 2", std::chrono::seconds(120));
  for (const json& e : ready["engines"]) EXPECT_NE(e["id"], 2) << ready.dump();
  EXPECT_EQ(HangFences(cluster.Log()), 1u) << cluster.Log();
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
