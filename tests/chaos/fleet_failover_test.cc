// The fleet drills (docs/fleet.md): a real 3-member etcd cluster on loopback, three Baton nodes
// (each its own controller, runtime directory and reference-engine pair, the engines on the
// node's own loopback address 127.0.2.N) and two routers that follow the fleet. Clients send
// through both routers while a fault runs; every answer must be 200 and equal its reference:
//
//   - kill -9 of every process of one node: its requests are replayed on the other nodes and
//     the routers drop it once its lease expires;
//   - SIGSTOP of every process of one node past its lease (a partition): the routers drop it,
//     cut its attempts in flight and replay them elsewhere; thawed, it registers again and
//     gets traffic again;
//   - one etcd member killed, then the whole etcd cluster stopped for 10 s: the routers keep
//     their last view and keep serving, the controllers keep their pairs, and once etcd is
//     back every node is listed again.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <sstream>
#include <vector>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_load.h"
#include "tests/fleet/etcd_cluster.h"

namespace baton::chaos {
namespace {

using fleet_test::EtcdCluster;
using std::chrono::milliseconds;

constexpr int kNodes = 3;

std::string NodeName(int i) { return std::string("node-") + static_cast<char>('a' + i); }

class FleetFailover : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
    etcd_ = std::make_unique<EtcdCluster>(3);
    ASSERT_TRUE(etcd_->WaitHealthy()) << "etcd did not come up:\n" << etcd_->LogTails();
    for (int i = 0; i < kNodes; ++i) {
      ClusterOptions o = TolerantHealth(RefenginePair());  // no failover may come of the load
      o.engine_command.insert(o.engine_command.end(),
                              {"--host", "127.0.2." + std::to_string(i + 1)});
      o.extra_toml = "[fleet]\netcd = \"" + EtcdList() +
                     "\"\nprefix = \"/baton-test/\"\nnode = \"" + NodeName(i) + "\"\nmodel = \"" +
                     kRouterTestModel + "\"\nlease_ttl_ms = 2000\netcd_timeout_ms = 300\n";
      nodes_.push_back(std::make_unique<ChaosCluster>(o));
    }
    for (int r = 0; r < 2; ++r) {
      routers_.push_back(std::make_unique<RouterProcess>(
          std::vector<std::string>{"--etcd", EtcdList(), "--etcd-prefix", "/baton-test/",
                                   "--etcd-timeout-ms", "300", "--fleet-router-name",
                                   "router-" + std::to_string(r)},
          nodes_[0]->dir(), "fleet-router-" + std::to_string(r) + ".log"));
      ASSERT_TRUE(routers_.back()->ready()) << routers_.back()->Log();
    }
    for (int i = 0; i < kNodes; ++i) WaitListed(i, true);
    // Each node is listed with the blocks its primary holds: listed with the load from before
    // that grant, the emptiest by far, it would draw every request until its next load report
    // (and TrafficReached would find none reaching the others).
    for (const auto& router : routers_) {
      for (int i = 0; i < kNodes; ++i) {
        const json entry = FleetEntry(*router, i);
        EXPECT_GT(entry.value("load", 0.0), 0.0) << NodeName(i) << ": " << entry.dump();
      }
    }
    References(routers_[0]->port(), "fleet", 12, &requests_, &want_);
  }

  std::string EtcdList() const {
    std::string list;
    for (const std::string& e : etcd_->endpoints()) list += (list.empty() ? "" : ",") + e;
    return list;
  }
  std::vector<uint16_t> Ports() const {
    std::vector<uint16_t> ports;
    for (const auto& r : routers_) ports.push_back(r->port());
    return ports;
  }
  // The router's /health `fleet` entry for node i (null when it never listed it).
  json FleetEntry(const RouterProcess& router, int i) const {
    const Reply r = Fetch(router.port(), http::verb::get, "/health", "", std::chrono::seconds(5));
    const json health = json::parse(r.body, nullptr, false);
    if (!health.is_object() || !health["fleet"].is_object()) return nullptr;
    for (const json& n : health["fleet"]["nodes"]) {
      if (n["node"] == NodeName(i)) return n;
    }
    return nullptr;
  }
  // Both routers' view of the fleet and their logs, for a failure's message.
  std::string FleetViews() const {
    std::string out;
    for (const auto& router : routers_) {
      const Reply r =
          Fetch(router->port(), http::verb::get, "/health", "", std::chrono::seconds(5));
      out += "\n/health: " + r.body + "\n" + router->Log();
    }
    return out;
  }
  // Waits until both routers list node i with a primary (`listed`) or no longer list it.
  void WaitListed(int i, bool listed) const {
    for (const auto& router : routers_) {
      json entry;
      bool ok = false;
      for (int k = 0; k < 600 && !ok; ++k) {
        entry = FleetEntry(*router, i);
        ok = listed ? entry.is_object() && entry["listed"] == true && entry["primary"] != ""
                    : entry.is_object() && entry["listed"] == false;
        if (!ok) std::this_thread::sleep_for(milliseconds(50));
      }
      ASSERT_TRUE(ok) << "a router never showed " << NodeName(i) << (listed ? " listed" : " gone")
                      << ": " << entry.dump() << "\n"
                      << router->Log();
    }
  }
  // Every process of node i: the controller, baton-keeper and the engines.
  // Node i's processes: its roster's engines, its controller and baton-keeper; never a pid
  // <= 0, which kill(2) would take for a process group (this test's own among them).
  std::vector<pid_t> NodePids(int i) const {
    std::vector<pid_t> pids = nodes_[i]->RosterPids();
    pids.push_back(nodes_[i]->controller_pid());
    pids.push_back(nodes_[i]->KeeperPid());
    std::erase_if(pids, [](pid_t p) { return p <= 0; });
    return pids;
  }
  // Attempts the routers ended on node i's engines so far (every engine, both routers).
  double AttemptsOn(int i) const {
    double sum = 0;
    const std::string prefix =
        "baton_router_fleet_engine_requests_total{node=\"" + NodeName(i) + "\"";
    for (const auto& router : routers_) {
      const Reply r = Fetch(router->port(), http::verb::get, "/metrics", "");
      std::istringstream lines(r.body);
      std::string line;
      while (std::getline(lines, line)) {
        if (line.rfind(prefix, 0) == 0) sum += std::atof(line.c_str() + line.rfind(' ') + 1);
      }
    }
    return sum;
  }
  // Sends requests through the routers until node i's engines have ended one: which node a
  // request goes to follows load and timing, so the set-up's traffic may have missed it.
  // False after `limit` requests.
  bool TrafficReached(int i, int limit = 64) const {
    for (int n = 0; n < limit && AttemptsOn(i) == 0; ++n) {
      const auto& router = routers_[static_cast<size_t>(n) % routers_.size()];
      Fetch(router->port(), http::verb::post, "/v1/completions",
            requests_[static_cast<size_t>(n) % requests_.size()].dump());
    }
    return AttemptsOn(i) > 0;
  }
  void ExpectServed(const LoadResult& r) const {
    for (const auto& router : routers_) ExpectNoFailure(r, *router);
  }

  std::unique_ptr<EtcdCluster> etcd_;
  std::vector<std::unique_ptr<ChaosCluster>> nodes_;
  std::vector<std::unique_ptr<RouterProcess>> routers_;
  std::vector<json> requests_;
  std::vector<StreamOutput> want_;
};

TEST_F(FleetFailover, ANodeKilledWholeIsReplayedOnTheOthers) {
  ASSERT_TRUE(TrafficReached(1)) << "node-b had no traffic before the fault: " << FleetViews();
  // A fleet's router follows etcd, not a controller: it reports no controller connection.
  const json health = json::parse(
      Fetch(routers_[0]->port(), http::verb::get, "/health", "", std::chrono::seconds(5)).body,
      nullptr, false);
  EXPECT_TRUE(health.is_object() && health["fleet"].is_object() &&
              !health.contains("controller_connected"))
      << health.dump();
  const std::string metrics =
      Fetch(routers_[0]->port(), http::verb::get, "/metrics", "", std::chrono::seconds(5)).body;
  EXPECT_EQ(metrics.find("baton_router_controller_connected"), std::string::npos);
  EXPECT_NE(metrics.find("baton_router_fleet_etcd_connected 1"), std::string::npos) << metrics;
  // A model no node serves: the same 404 as one engine gives for an unknown model.
  const Reply unknown =
      Fetch(routers_[0]->port(), http::verb::post, "/v1/completions",
            R"({"model": "nope", "prompt": [1], "max_tokens": 1})", std::chrono::seconds(10));
  EXPECT_EQ(unknown.status, 404) << unknown.body;
  const json error = json::parse(unknown.body, nullptr, false);
  EXPECT_TRUE(error.is_object() && error["error"]["type"] == "not_found_error" &&
              error["error"]["param"] == "model" && error["error"]["code"] == "model_not_found")
      << unknown.body;
  const LoadResult r = LoadAround(Ports(), requests_, want_, [&] {
    nodes_[1]->KillController();
    nodes_[1]->KillLeftovers();
    WaitListed(1, false);  // its lease expired
  });
  ExpectServed(r);
  for (int i : {0, 2}) {
    EXPECT_TRUE(FleetEntry(*routers_[0], i)["listed"] == true) << NodeName(i);
    nodes_[i]->CheckFencing();
  }
}

TEST_F(FleetFailover, APartitionedNodeIsDroppedAndTakenBackWhenItReturns) {
  const std::vector<pid_t> pids = NodePids(1);
  const LoadResult r = LoadAround(Ports(), requests_, want_, [&] {
    for (pid_t p : pids) ::kill(p, SIGSTOP);
    WaitListed(1, false);  // past its lease, the routers cut it off
  });
  for (pid_t p : pids) ::kill(p, SIGCONT);
  ExpectServed(r);
  WaitListed(1, true);  // it registered again
  const double before = AttemptsOn(1);
  const LoadResult again = LoadAround(Ports(), requests_, want_, [] {});
  ExpectServed(again);
  EXPECT_GT(AttemptsOn(1), before) << "node-b got no traffic after it came back";
  nodes_[1]->WaitReady("node-b's pair after the thaw");
  nodes_[1]->CheckFencing();
}

TEST_F(FleetFailover, EtcdFaultsStopNothing) {
  std::vector<uint64_t> primaries;
  for (const auto& n : nodes_) primaries.push_back(PrimaryId(n->Status()));
  const LoadResult one = LoadAround(Ports(), requests_, want_, [&] {
    etcd_->Kill(0);
    std::this_thread::sleep_for(milliseconds(3000));  // past the leases' TTL
  });
  ExpectServed(one);
  for (int i = 0; i < kNodes; ++i) WaitListed(i, true);

  const LoadResult all = LoadAround(Ports(), requests_, want_, [&] {
    for (int m = 1; m < etcd_->size(); ++m) etcd_->Kill(m);
    std::this_thread::sleep_for(milliseconds(10'000));
    const json away = FleetEntry(*routers_[1], 2);
    EXPECT_TRUE(away["listed"] == true) << "the router dropped its last view: " << away.dump();
    for (int m = 0; m < etcd_->size(); ++m) etcd_->Start(m);
  });
  ExpectServed(all);
  ASSERT_TRUE(etcd_->WaitHealthy()) << "etcd did not come back:\n" << etcd_->LogTails();
  for (int i = 0; i < kNodes; ++i) {
    WaitListed(i, true);
    EXPECT_EQ(PrimaryId(nodes_[i]->Status()), primaries[i]) << NodeName(i) << " lost its pair";
    nodes_[i]->CheckFencing();
  }
}

}  // namespace
}  // namespace baton::chaos
