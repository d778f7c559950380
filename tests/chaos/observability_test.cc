// What the controller tells the outside world: the route table to subscribers, Prometheus
// metrics, and `batonctl` with no flags (the default runtime directory).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "tests/chaos/chaos_harness.h"

namespace baton::chaos {
namespace {

// The next RouteTable whose primary is not `not_primary` (0: any primary).
Result<proto::RouteTable> NextTableWithPrimary(proto::Channel& router, uint64_t not_primary) {
  for (int i = 0; i < 100; ++i) {
    BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, router.Receive(std::chrono::seconds(20)));
    BATON_ASSIGN_OR_RETURN(proto::RouteTable table, msg.As<proto::RouteTable>());
    for (const proto::RouteEntry& e : table.entries) {
      if (e.role == proto::EngineRole::kPrimary && e.ready && e.engine_id != not_primary)
        return table;
    }
  }
  return DeadlineExceeded("no route table with a new primary");
}

TEST(ChaosRoutes, SubscriberSeesTheNewPrimary) {
  ChaosCluster cluster;
  boost::asio::io_context io;
  Result<proto::Channel> router = proto::Connect(io, cluster.socket());
  ASSERT_TRUE(router.ok());
  ASSERT_TRUE(
      proto::ClientHello(
          *router, {.peer_name = "router", .role = proto::PeerRole::kRouter, .launch_token = ""})
          .ok());
  ASSERT_TRUE(router->Send(proto::Subscribe{.subscriber = "test-router"}).ok());
  Result<proto::RouteTable> first = NextTableWithPrimary(*router, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->pair_state, "ready");
  uint64_t primary = 0;
  for (const proto::RouteEntry& e : first->entries) {
    if (e.role == proto::EngineRole::kPrimary) primary = e.engine_id;
  }
  const json status = cluster.Status();
  EXPECT_EQ(primary, PrimaryId(status));
  EXPECT_EQ(status["routes"]["subscribers"], 1);

  ASSERT_EQ(::kill(PidOf(EngineWithRole(status, "primary")), SIGKILL), 0);
  Result<proto::RouteTable> next = NextTableWithPrimary(*router, primary);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_GT(next->version, first->version);
  EXPECT_GT(next->epoch, first->epoch);
}

// `request` sent raw over plain TCP (its send may be cut short when the server answers and
// closes first); the whole response.
std::string HttpRaw(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return response;
}

// GET `path` over plain TCP.
std::string HttpGet(int port, const std::string& path) {
  return HttpRaw(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n");
}

TEST(ChaosMetrics, PrometheusEndpoint) {
  ClusterOptions options;
  options.metrics_port = FreeTcpPort();
  ASSERT_GT(options.metrics_port, 0);
  ChaosCluster cluster(options);
  const std::string metrics = HttpGet(options.metrics_port, "/metrics");
  EXPECT_NE(metrics.find("200 OK"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("baton_pair_ready 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("baton_epoch 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("# TYPE baton_failovers_total counter"), std::string::npos);
  EXPECT_NE(metrics.find("baton_barrier_waits 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("baton_epoch_journal_ok 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("baton_unfenced_reaped 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("baton_epoch_journal_write_failures_total 0"), std::string::npos);
  EXPECT_NE(metrics.find("baton_engines_liveness_watched 2\n"), std::string::npos)
      << "both engines of a ready pair, on the SDK, sent their liveness page: " << metrics;
  const bool cgroups = cluster.Status()["fencing"]["by"] == "cgroup";
  EXPECT_NE(metrics.find(cgroups ? "baton_engine_cgroups 1" : "baton_engine_cgroups 0"),
            std::string::npos)
      << metrics;
  const std::string primary = std::to_string(PrimaryId(cluster.Status()));
  EXPECT_NE(metrics.find("baton_engine_blocks{engine_id=\"" + primary + "\",role=\"primary\"} " +
                         std::to_string(BlocksBesideTheReserve(cluster.Status())) + "\n"),
            std::string::npos)
      << metrics;
  // Bad requests get 4xx JSON errors; a chunk line that never ends cannot grow the daemon.
  const std::string nope = HttpGet(options.metrics_port, "/nope");
  EXPECT_NE(nope.find("404"), std::string::npos) << nope;
  EXPECT_NE(nope.find("{\"error\":{\"message\""), std::string::npos) << nope;
  EXPECT_NE(HttpGet(options.metrics_port, "/metrics?name=x").find("200 OK"), std::string::npos);
  const std::string endless =
      HttpRaw(options.metrics_port,
              "POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;" +
                  std::string(1 << 20, 'a'));
  EXPECT_EQ(endless.rfind("HTTP/1.1 413", 0), 0u) << endless.substr(0, 300);
  EXPECT_EQ(HttpRaw(options.metrics_port, "NOT HTTP\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_NE(HttpGet(options.metrics_port, "/metrics").find("200 OK"), std::string::npos);
}

uint64_t CounterValue(const std::string& metrics, const std::string& name) {
  const size_t at = metrics.find("\n" + name + " ");
  if (at == std::string::npos) return UINT64_MAX;
  return std::stoull(metrics.substr(at + name.size() + 2));
}

// While a promoted standby takes its time to answer (half a second here), the controller
// waits on its timers and sockets: its housekeeping timer runs a few times (heartbeat
// deadlines, at most every 250 ms), not in a loop that takes the CPU from the engine it waits
// for.
TEST(ChaosMetrics, ControllerIdlesWhileAPromotionIsInFlight) {
  ClusterOptions options;
  options.metrics_port = FreeTcpPort();
  options.engine_args = {"--promote-delay-ms", "500"};
  options.standby_relaunch_delay_ms = 0;
  ASSERT_GT(options.metrics_port, 0);
  ChaosCluster cluster(options);
  const uint64_t before =
      CounterValue(HttpGet(options.metrics_port, "/metrics"), "baton_controller_ticks_total");
  ASSERT_NE(before, UINT64_MAX);
  const json primary = EngineWithRole(cluster.Status(), "primary");
  ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
  cluster.WaitFor(
      [&](const json& s) { return IsReady(s) && PrimaryId(s) != primary["id"].get<uint64_t>(); },
      "the slow standby's promotion");
  const uint64_t after =
      CounterValue(HttpGet(options.metrics_port, "/metrics"), "baton_controller_ticks_total");
  EXPECT_LT(after - before, 100u) << "ticks during a 500 ms promotion";
  cluster.CheckFencing();
}

// The line of `metrics` that starts with `prefix` ("" if none).
std::string MetricLine(const std::string& metrics, const std::string& prefix) {
  const size_t at = metrics.find("\n" + prefix);
  if (at == std::string::npos) return "";
  return metrics.substr(at + 1, metrics.find('\n', at + 1) - at - 1);
}

// A failover on the promotion reserve: /metrics, `batonctl timeline` and `batonctl status`
// show its ready and teardown times side by side, the blocks it quarantined and the reserve.
TEST(ChaosMetrics, AFailoverShowsReadyBesideTeardownAndTheReserve) {
  ClusterOptions options;
  options.metrics_port = FreeTcpPort();
  options.promotion_reserve_blocks = 4;
  ASSERT_GT(options.metrics_port, 0);
  ChaosCluster cluster(options);
  const uint64_t old_primary = PrimaryId(cluster.Status());
  // The first promotion is no failover: the "slowest failover" rules read nothing of it.
  const std::string first = HttpGet(options.metrics_port, "/metrics");
  EXPECT_EQ(MetricLine(first, "baton_last_failover_ready_ms "), "") << first;
  EXPECT_NE(MetricLine(first, "baton_failover_ready_ms{seq=\"1\",kind=\"promotion\""), "") << first;
  ASSERT_EQ(::kill(PidOf(EngineWithRole(cluster.Status(), "primary")), SIGKILL), 0);
  cluster.WaitFor([&](const json& s) { return Settled(s) && PrimaryId(s) != old_primary; },
                  "the failover to settle, the reserve whole again");
  const std::string metrics = HttpGet(options.metrics_port, "/metrics");
  EXPECT_EQ(MetricLine(metrics, "baton_promotion_reserve_blocks "),
            "baton_promotion_reserve_blocks 4")
      << metrics;
  EXPECT_EQ(MetricLine(metrics, "baton_promotion_reserve_target_blocks "),
            "baton_promotion_reserve_target_blocks 4");
  const std::string labels = "{seq=\"2\",kind=\"failover\",before_barrier=\"true\"} ";
  EXPECT_NE(MetricLine(metrics, "baton_failover_ready_ms" + labels), "") << metrics;
  EXPECT_NE(MetricLine(metrics, "baton_last_failover_ready_ms "), "") << metrics;
  EXPECT_NE(MetricLine(metrics, "baton_failover_teardown_ms" + labels), "") << metrics;
  EXPECT_EQ(MetricLine(metrics, "baton_failover_quarantined_blocks" + labels),
            "baton_failover_quarantined_blocks" + labels + "12")
      << metrics;
  const CtlResult timeline = cluster.CtlPlain({"timeline"});
  ASSERT_EQ(timeline.exit_code, 0) << timeline.stdout_text;
  EXPECT_NE(timeline.stdout_text.find(" teardown "), std::string::npos) << timeline.stdout_text;
  EXPECT_NE(timeline.stdout_text.find("  barrier_passed"), std::string::npos);
  EXPECT_NE(timeline.stdout_text.find("promotion: before the barrier, on a reserve of 4 blocks; "
                                      "12 blocks quarantined until it passed"),
            std::string::npos)
      << timeline.stdout_text;
  const CtlResult status = cluster.CtlPlain({"status"});
  EXPECT_NE(status.stdout_text.find("promotion reserve 4 of 4 blocks"), std::string::npos)
      << status.stdout_text;
  cluster.CheckFencing();
}

TEST(ChaosCli, BatonctlFindsTheDefaultSocket) {
  ChaosCluster cluster;
  const std::string cmd = "BATON_RUNTIME_DIR=" + cluster.dir() + "/run " + BATON_BIN_DIR +
                          "/batonctl status > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  const std::string elsewhere =
      "BATON_RUNTIME_DIR=/nonexistent " + std::string(BATON_BIN_DIR) +
      "/batonctl --json status 2>/dev/null | tail -1 | grep -q '\"ok\":false'";
  EXPECT_EQ(std::system(elsewhere.c_str()), 0) << "unreachable: one JSON object with the reason";
  const std::string unreachable = "BATON_RUNTIME_DIR=/nonexistent " + std::string(BATON_BIN_DIR) +
                                  "/batonctl status > /dev/null 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(unreachable.c_str())), 1);
}

// Plain `batonctl status` shows what operations.md promises: the pair, each engine, the pool,
// the weights with their load speed, the route table, and recent exits.
TEST(ChaosCli, PlainStatusShowsRoutesAndExits) {
  ChaosCluster cluster;
  const json primary = EngineWithRole(cluster.Status(), "primary");  // either engine may win
  ASSERT_EQ(::kill(PidOf(primary), SIGKILL), 0);
  const uint64_t old_id = primary["id"].get<uint64_t>();
  // Until the controller has seen the death, the pair it reports is the one before the kill.
  cluster.WaitFor([&](const json& st) { return PrimaryId(st) != 0 && PrimaryId(st) != old_id; },
                  "the standby promoted");
  cluster.WaitReady("the pair after the failover");
  const std::string exit = "exit: engine " + std::to_string(old_id) + " ";
  const CtlResult plain = cluster.CtlPlain({"status"});
  const std::string& text = plain.stdout_text;
  EXPECT_EQ(plain.exit_code, 0) << text;
  for (const std::string& want :
       {std::string("pair ready"), std::string("pool "), std::string("GB/s"),
        std::string("routes v"), std::string("=primary(ready"), exit,
        std::string("killed by SIGKILL"), std::string("recent transitions"),
        std::string("fencing: ")}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << " in:\n" << text;
  }
  // The dead engine's record is gone; its last changes of state are still listed.
  const json transitions = cluster.Status()["transitions"];
  bool fencing = false;
  for (const json& t : transitions) {
    fencing |= t["machine"] == "engine " + std::to_string(primary["id"].get<uint64_t>()) &&
               t["from"] == "primary" && t["to"] == "fencing";
  }
  EXPECT_TRUE(fencing) << transitions.dump(1);
}

}  // namespace
}  // namespace baton::chaos
