// A controller that hangs instead of dying is replaced (docs/operations.md, failure modes).
// The test supervises the controller as systemd does with the shipped unit
// (deploy/systemd/baton-controller.service.in: Type=notify, WatchdogSec, WatchdogSignal=SIGKILL,
// Restart=always): the controller gets NOTIFY_SOCKET and WATCHDOG_USEC, and once its WATCHDOG=1
// pings have stopped for WatchdogSec the test kills it with SIGKILL and starts a new one.
//
// Under load through the router, the controller is stopped (SIGSTOP, as a deadlock or a stall
// would stop it) and the primary is then killed with kill -9 while no controller can see it.
// Meanwhile the router holds the requests that have no live primary in its queue instead of
// sending them to the dead one's closed port. The new controller re-adopts the standby, fences
// the dead primary and promotes the standby; every request is answered 200 and equals its
// reference. Outcomes are asserted; the time from the kill to the promotion is printed.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/notify_socket.h"
#include "tests/chaos/router_load.h"
#include "tests/chaos/router_stream_support.h"

namespace baton::chaos {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// WatchdogSec of the shipped controller unit.
milliseconds UnitWatchdog() {
  const std::string unit =
      ReadFile(std::string(BATON_SOURCE_DIR) + "/deploy/systemd/baton-controller.service.in");
  std::smatch m;
  if (!std::regex_search(unit, m, std::regex(R"(\nWatchdogSec=(\d+)s\n)"))) return milliseconds(0);
  return milliseconds(std::stoi(m[1]) * 1000);
}

TEST(ControllerHang, AStoppedControllerIsReplacedAndTheStandbyPromotedWithNothingLost) {
  const milliseconds watchdog = UnitWatchdog();
  ASSERT_GT(watchdog.count(), 0) << "no WatchdogSec=Ns in the shipped unit";
  char tmpl[] = "/tmp/baton-notify-XXXXXX";
  const std::string notify_dir = ::mkdtemp(tmpl) != nullptr ? tmpl : "/tmp";
  NotifySocket notify(notify_dir + "/notify.sock");
  ASSERT_TRUE(notify.bound()) << notify.path();
  const std::vector<std::string> env = {"NOTIFY_SOCKET=" + notify.path(),
                                        "WATCHDOG_USEC=" + std::to_string(watchdog.count() * 1000)};
  ClusterOptions o = RefenginePair();
  o.controller_env = env;
  ChaosCluster cluster(o);
  ASSERT_TRUE(notify.WaitReadyAndPing(std::chrono::seconds(20)))
      << "no READY=1 and WATCHDOG=1 from the controller\n"
      << cluster.Log();
  // The outage (WatchdogSec, a restart, a promotion) can outlast the default queue wait on a
  // loaded host; the router must hold the requests through it rather than answer 429.
  RouterProcess router({"--controller", cluster.socket(), "--max-queue-wait-ms", "30000"},
                       cluster.dir(), "router.log");
  ASSERT_TRUE(router.ready()) << router.Log();
  std::vector<json> requests;
  std::vector<StreamOutput> want;
  References(router.port(), "hang", 12, &requests, &want);
  const json before = cluster.WaitReady();
  const json standby = EngineWithRole(before, "standby");
  const pid_t primary_pid = PidOf(EngineWithRole(before, "primary"));
  const pid_t controller_pid = cluster.controller_pid();

  double promoted_after_ms = -1, killed_after_ms = -1;
  json after;
  const LoadResult load = LoadAround(router.port(), requests, want, [&] {
    ASSERT_EQ(::kill(controller_pid, SIGSTOP), 0);
    ASSERT_EQ(::kill(primary_pid, SIGKILL), 0);
    const auto primary_killed = Clock::now();
    // The supervisor: no ping for WatchdogSec, then SIGKILL and a new controller.
    ASSERT_TRUE(notify.WaitSilence(watchdog, std::chrono::seconds(60)))
        << "the stopped controller still pings";
    cluster.KillController();
    killed_after_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - primary_killed).count();
    cluster.StartControllerAgain(env);
    after = cluster.WaitFor(
        [&](const json& s) { return PrimaryId(s) == standby["id"].get<uint64_t>(); },
        "the standby promoted by the new controller", std::chrono::seconds(30));
    promoted_after_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - primary_killed).count();
  });
  ExpectNoFailure(load, router);
  EXPECT_EQ(PrimaryId(after), standby["id"].get<uint64_t>());
  EXPECT_EQ(PidOf(EngineWithRole(after, "primary")), PidOf(standby))
      << "the standby was not re-adopted: a new process serves";
  EXPECT_NE(cluster.controller_pid(), controller_pid);
  // Gone, or a zombie of the killed controller left for init to reap.
  const std::string stat = ReadFile("/proc/" + std::to_string(primary_pid) + "/stat");
  EXPECT_TRUE(stat.empty() || stat.find(") Z ") != std::string::npos) << stat;
  const json recovery = after["controller"]["recovery"];
  EXPECT_TRUE(recovery["restarted"].get<bool>()) << recovery.dump();
  EXPECT_NE(cluster.Log().find("baton-controller"), std::string::npos);
  cluster.WaitReady("a new standby");
  cluster.CheckFencing();
  std::printf(
      "{\"watchdog_ms\": %lld, \"controller_killed_after_ms\": %.1f, \"promoted_after_ms\": %.1f, "
      "\"requests\": %d, \"spanning_fault\": %d, \"failed\": %zu}\n",
      static_cast<long long>(watchdog.count()), killed_after_ms, promoted_after_ms, load.done,
      load.spanning_fault, load.failures.size());
  std::error_code ec;
  std::filesystem::remove_all(notify_dir, ec);
}

}  // namespace
}  // namespace baton::chaos
