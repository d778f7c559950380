// Fleet-wide canary upgrades (docs/fleet.md, Fleet-wide upgrades) on three real Baton nodes
// sharing a real 3-member etcd cluster, each node a controller with its pair of reference
// engines and its own baton-router under load:
//
//  * `batonctl fleet upgrade --wait -- CMD` on one node rolls CMD across the three, one node at
//    a time, each through its own canary judge, and ends done with every node promoted; no
//    client sees an error. `batonctl fleet status` then shows every node on the new version.
//  * The new build misbehaves on node-b only (every completion answered 500): node-b's canary
//    is rolled back on its error rate, the rollout stops, node-a (already upgraded) goes back
//    to the previous command through a canary of its own, and node-c never upgrades.
//  * A paused rollout starts no node; resumed from another node, it goes on and ends done.
//  * A node's controller killed with kill -9 during its canary: the next one resumes the canary
//    and the rollout ends done.
//  * A rollout of a program outside the nodes' fleet.rollout_programs (written straight to etcd,
//    as anyone who can write there could) is refused by the first node, which fails; the
//    rollout rolls back at once and nothing of it runs anywhere.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "controller/rollout/rollout_record.h"
#include "fleet/etcd_client.h"
#include "fleet/fleet_records.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_stream_support.h"
#include "tests/fleet/etcd_cluster.h"

namespace baton::chaos {
namespace {

using fleet_test::EtcdCluster;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kPrefix = "/baton-rollout/";
const char* const kNodes[] = {"node-a", "node-b", "node-c"};

// `builds`: the directory the new builds are in, which rollouts may run.
std::string FleetToml(const EtcdCluster& etcd, const std::string& node, const std::string& builds) {
  std::string list;
  for (const std::string& e : etcd.endpoints()) list += (list.empty() ? "" : ",") + e;
  return "[fleet]\netcd = \"" + list + "\"\nprefix = \"" + kPrefix + "\"\nnode = \"" + node +
         "\"\nmodel = \"tiny\"\nlease_ttl_ms = 2000\netcd_timeout_ms = 300\n" +
         "rollout_programs = [\"" + builds + "/\"]\n";
}

// Clients that keep every router busy with small seeded requests until destroyed; counts the
// answers that were not 200.
class FleetLoad {
 public:
  explicit FleetLoad(const std::vector<uint16_t>& ports) {
    for (uint16_t port : ports) {
      for (int c = 0; c < 2; ++c) {
        threads_.emplace_back([this, port, c] {
          for (int i = 0; !stop_; ++i) {
            const json body = {{"model", kRouterTestModel},
                               {"prompt", "fleet " + std::to_string(c) + " #" + std::to_string(i)},
                               {"seed", 100 + i % 50},
                               {"max_tokens", 4}};
            const Reply r =
                Fetch(port, http::verb::post, "/v1/completions", body.dump(), seconds(30));
            ++done_;
            if (r.status != 200) ++failed_;
          }
        });
      }
    }
  }
  ~FleetLoad() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
  }
  int done() const { return done_; }
  int failed() const { return failed_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> done_{0}, failed_{0};
  std::vector<std::thread> threads_;
};

class FleetUpgrade : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
    etcd_ = std::make_unique<EtcdCluster>(3);
    ASSERT_TRUE(etcd_->WaitHealthy()) << "etcd did not come up:\n" << etcd_->LogTails();
    auto c = EtcdClient::Create({.endpoints = etcd_->endpoints(), .timeout = milliseconds(300)});
    ASSERT_TRUE(c.ok());
    reader_ = std::move(*c);
    char tmpl[] = "/tmp/baton-new-build-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    builds_ = tmpl;
    std::vector<uint16_t> ports;
    for (const char* node : kNodes) {
      ClusterOptions o = RefenginePair();
      o.extra_toml = FleetToml(*etcd_, node, builds_);
      nodes_.push_back(std::make_unique<ChaosCluster>(o));
      routers_.push_back(
          std::make_unique<RouterProcess>(nodes_.back()->socket(), nodes_.back()->dir()));
      ASSERT_TRUE(routers_.back()->ready()) << routers_.back()->Log();
      ports.push_back(routers_.back()->port());
    }
    for (int i = 0; i < 200 && Listed() < 3; ++i) std::this_thread::sleep_for(milliseconds(50));
    ASSERT_EQ(Listed(), 3u) << "every node registers in etcd";
    WriteWrapper();
    load_ = std::make_unique<FleetLoad>(ports);
  }
  void TearDown() override {
    load_.reset();
    if (!builds_.empty()) std::filesystem::remove_all(builds_);
  }

  size_t Listed() const {
    Result<EtcdRange> r = reader_->GetPrefix(std::string(kPrefix) + "nodes/");
    return r.ok() ? r->kvs.size() : 0;
  }

  // The new build: the reference engine as "refengine-v2", started through a wrapper that
  // breaks it (--fail-percent 100) on a node whose runtime directory holds a file "broken".
  void WriteWrapper() {
    wrapper_ = builds_ + "/new-build.sh";
    std::ofstream out(wrapper_);
    out << "#!/bin/sh\nrun=\"$1\"\nshift\n"
        << "if [ -e \"$run/broken\" ]; then exec \"$@\" --fail-percent 100; fi\nexec \"$@\"\n";
    out.close();
    ::chmod(wrapper_.c_str(), 0755);
  }
  std::vector<std::string> UpgradeArgs() const {
    std::vector<std::string> args = {"fleet",  "upgrade",   "--wait", "--steps",
                                     "50,100", "--step-ms", "300",    "--min-requests",
                                     "5",      "--",        wrapper_, "{runtime_dir}"};
    for (const std::string& a : RefenginePair().engine_command) args.push_back(a);
    args.push_back("--engine-version");
    args.push_back("refengine-v2");
    return args;
  }
  // Polls `fleet rollout` on `node` until `pred` holds for the rollout; returns it.
  json WaitRollout(size_t node, const std::function<bool(const json&)>& pred,
                   const std::string& what, seconds timeout = seconds(90)) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    json r;
    while (std::chrono::steady_clock::now() < until) {
      const CtlResult got = nodes_[node]->Ctl({"fleet", "rollout"});
      if (got.exit_code == 0 && got.out["rollout"].is_object()) {
        r = got.out["rollout"];
        if (pred(r)) return r;
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
    ADD_FAILURE() << "timed out waiting for " << what << "; last: " << r.dump();
    return r;
  }
  static json NodeEntry(const json& rollout, const std::string& node) {
    for (const json& n : rollout["nodes"]) {
      if (n["node"] == node) return n;
    }
    return nullptr;
  }

  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<EtcdClient> reader_;
  std::vector<std::unique_ptr<ChaosCluster>> nodes_;
  std::vector<std::unique_ptr<RouterProcess>> routers_;
  std::unique_ptr<FleetLoad> load_;
  std::string builds_;  // fleet.rollout_programs of every node
  std::string wrapper_;
};

TEST_F(FleetUpgrade, PromotesOnEveryNodeOneAtATime) {
  const auto start = std::chrono::steady_clock::now();
  const CtlResult up = nodes_[0]->Ctl(UpgradeArgs());
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(up.exit_code, 0) << up.stdout_text << "\n" << nodes_[1]->Log();
  const json& rollout = up.out["rollout"];
  EXPECT_EQ(rollout["state"], "done") << rollout.dump();
  for (const char* node : kNodes) {
    const json n = NodeEntry(rollout, node);
    EXPECT_EQ(n["state"], "promoted") << n.dump();
    EXPECT_EQ(n["version"], "refengine-v2") << n.dump();
  }
  // One at a time: each node started after the one before it was promoted.
  EXPECT_LE(NodeEntry(rollout, "node-a")["since_ms"], NodeEntry(rollout, "node-b")["since_ms"]);
  EXPECT_LE(NodeEntry(rollout, "node-b")["since_ms"], NodeEntry(rollout, "node-c")["since_ms"]);
  for (const auto& node : nodes_) {
    const json s = node->WaitReady("the pair after the rollout");
    EXPECT_EQ(EngineWithRole(s, "primary")["version"], "refengine-v2");
    EXPECT_EQ(s["upgrade"]["promoted"], 1);
    // Each controller reads the record every 200 ms: it sees the end within one reading.
    node->WaitFor([](const json& st) { return st["fleet"]["rollout"]["state"] == "done"; },
                  "the node sees the rollout done");
    node->CheckFencing();
  }
  const CtlResult status = nodes_[2]->Ctl({"fleet", "status"});
  ASSERT_EQ(status.exit_code, 0) << status.stdout_text;
  ASSERT_EQ(status.out["nodes"].size(), 3u) << status.out.dump();
  for (const json& n : status.out["nodes"]) {
    EXPECT_EQ(n["version"], "refengine-v2") << n.dump();
    EXPECT_EQ(n["pair_state"], "ready") << n.dump();
  }
  const CtlResult again = nodes_[1]->Ctl({"fleet", "pause"});
  EXPECT_EQ(again.exit_code, 1) << "a rollout that is done is not paused: " << again.stdout_text;
  EXPECT_GT(load_->done(), 0);
  EXPECT_EQ(load_->failed(), 0) << "of " << load_->done() << " requests";
  std::printf("fleet upgrade of 3 nodes, one at a time: %.1f s\n", took_s);
}

TEST_F(FleetUpgrade, ARollbackOnTheSecondNodeRollsTheFirstBackAndSparesTheThird) {
  { std::ofstream(nodes_[1]->dir() + "/run/broken") << "1"; }
  const auto start = std::chrono::steady_clock::now();
  const CtlResult up = nodes_[2]->Ctl(UpgradeArgs());
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(up.exit_code, 1) << up.stdout_text;
  const json& rollout = up.out["rollout"];
  ASSERT_TRUE(rollout.is_object()) << up.stdout_text;
  EXPECT_EQ(rollout["state"], "rolled_back") << rollout.dump();
  EXPECT_NE(rollout["reason"].get<std::string>().find("node-b"), std::string::npos)
      << rollout.dump();
  EXPECT_EQ(NodeEntry(rollout, "node-a")["state"], "rolled_back") << rollout.dump();
  const json b = NodeEntry(rollout, "node-b");
  EXPECT_EQ(b["state"], "rolled_back") << b.dump();
  EXPECT_NE(b["reason"].get<std::string>().find("error rate"), std::string::npos) << b.dump();
  EXPECT_EQ(NodeEntry(rollout, "node-c")["state"], "pending") << rollout.dump();

  const json a = nodes_[0]->WaitReady("node-a after its way back");
  EXPECT_EQ(EngineWithRole(a, "primary")["version"], "baton-refengine");
  EXPECT_EQ(a["upgrade"]["promoted"], 2) << "the canary, then the way back";
  const json bs = nodes_[1]->WaitReady("node-b after its rollback");
  EXPECT_EQ(EngineWithRole(bs, "primary")["version"], "baton-refengine");
  EXPECT_EQ(bs["upgrade"]["rolled_back"], 1);
  const json cs = nodes_[2]->Status();
  EXPECT_EQ(EngineWithRole(cs, "primary")["version"], "baton-refengine");
  EXPECT_TRUE(cs["upgrade"]["history"].empty()) << "node-c never upgraded";
  for (const auto& node : nodes_) node->CheckFencing();
  EXPECT_GT(load_->done(), 0);
  EXPECT_EQ(load_->failed(), 0) << "the routers retry what the broken canary failed";
  std::printf("fleet upgrade stopped on node-b and rolled node-a back: %.1f s\n", took_s);
}

TEST_F(FleetUpgrade, APausedRolloutStartsNoNodeAndResumesFromAnotherNode) {
  std::vector<std::string> args = UpgradeArgs();
  args.erase(args.begin() + 2);  // no --wait
  const CtlResult up = nodes_[0]->Ctl(args);
  ASSERT_EQ(up.exit_code, 0) << up.stdout_text;
  const CtlResult paused = nodes_[1]->Ctl({"fleet", "pause"});
  ASSERT_EQ(paused.exit_code, 0) << paused.stdout_text;
  EXPECT_EQ(paused.out["rollout"]["state"], "paused");
  // The node in flight, if any, finishes; no other starts.
  WaitRollout(
      2, [](const json& r) { return r["nodes"][0]["state"] != "upgrading"; },
      "node-a's canary to end");
  std::this_thread::sleep_for(milliseconds(1500));
  json r = WaitRollout(
      2, [](const json&) { return true; }, "the rollout");
  EXPECT_EQ(r["state"], "paused") << r.dump();
  EXPECT_EQ(NodeEntry(r, "node-b")["state"], "pending") << r.dump();
  EXPECT_EQ(NodeEntry(r, "node-c")["state"], "pending") << r.dump();

  const CtlResult resumed = nodes_[2]->Ctl({"fleet", "resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stdout_text;
  r = WaitRollout(
      0, [](const json& x) { return x["state"] == "done"; }, "the rollout to end done",
      seconds(120));
  for (const char* node : kNodes) EXPECT_EQ(NodeEntry(r, node)["state"], "promoted") << r.dump();
  for (const auto& node : nodes_) {
    const json s = node->WaitReady("the pair after the rollout");
    EXPECT_EQ(EngineWithRole(s, "primary")["version"], "refengine-v2");
    node->CheckFencing();
  }
  EXPECT_EQ(load_->failed(), 0) << "of " << load_->done() << " requests";
}

// kill -9 of node-b's controller while node-b's canary serves: the next controller re-adopts
// the primary and the canary and resumes the canary, which is promoted; the rollout, which
// waited on node-b meanwhile, goes on to node-c and ends done. No client sees an error.
TEST_F(FleetUpgrade, AControllerKilledDuringItsCanaryResumesItAndTheRolloutEndsDone) {
  std::vector<std::string> args = UpgradeArgs();
  args.erase(args.begin() + 2);  // no --wait
  args[5] = "3000";              // --step-ms: time to kill the controller within a step
  const CtlResult up = nodes_[0]->Ctl(args);
  ASSERT_EQ(up.exit_code, 0) << up.stdout_text;
  nodes_[1]->WaitFor(
      [](const json& st) {
        return !st["upgrade"]["current"].is_null() && st["upgrade"]["current"]["phase"] == "canary";
      },
      "node-b's canary serves", seconds(90));
  nodes_[1]->KillController();
  nodes_[1]->StartControllerAgain();
  const json r = WaitRollout(
      2, [](const json& x) { return x["state"] == "done"; }, "the rollout to end done",
      seconds(120));
  for (const char* node : kNodes) EXPECT_EQ(NodeEntry(r, node)["state"], "promoted") << r.dump();
  const json b = nodes_[1]->WaitReady("node-b after its resumed canary");
  EXPECT_EQ(EngineWithRole(b, "primary")["version"], "refengine-v2") << b.dump();
  EXPECT_EQ(EngineWithRole(b, "standby")["version"], "refengine-v2") << b.dump();
  EXPECT_NE(b["controller"]["recovery"]["upgrade"].get<std::string>().find("resumed at"),
            std::string::npos)
      << b["controller"].dump();
  for (const auto& node : nodes_) node->CheckFencing();
  EXPECT_EQ(load_->failed(), 0) << "of " << load_->done() << " requests";
}

// Whoever can write the rollout record chooses its command; each node runs only what its own
// configuration allows. `fleet upgrade` refuses such a command on the node asked; a record
// written straight to etcd fails the first node, and the rollout rolls back at once.
TEST_F(FleetUpgrade, AProgramOutsideRolloutProgramsIsRefusedAndTheRolloutStops) {
  const std::string marker = builds_ + "/pwned";
  const std::vector<std::string> command = {"/bin/sh", "-c", "touch " + marker};
  std::vector<std::string> args = {"fleet", "upgrade", "--"};
  args.insert(args.end(), command.begin(), command.end());
  const CtlResult asked = nodes_[0]->Ctl(args);
  EXPECT_EQ(asked.exit_code, 1) << asked.stdout_text;
  EXPECT_NE(asked.stdout_text.find("fleet.rollout_programs"), std::string::npos)
      << asked.stdout_text;

  Rollout r;
  r.id = "rollout-from-etcd";
  r.command = command;
  r.started_by = "not-a-node";
  r.created_ms = r.updated_ms = UnixMillisNow();
  for (const char* n : kNodes) r.nodes.push_back({.node = n});
  ASSERT_TRUE(reader_->Put(FleetRolloutKey(kPrefix), RolloutRecord(r)).ok());
  const json rollout = WaitRollout(
      1, [](const json& x) { return x["state"] == "rolled_back"; }, "the rollout rolled back");
  const json a = NodeEntry(rollout, "node-a");
  EXPECT_EQ(a["state"], "failed") << rollout.dump();
  EXPECT_NE(a["reason"].get<std::string>().find("is not allowed on this node"), std::string::npos)
      << a.dump();
  EXPECT_NE(a["reason"].get<std::string>().find("fleet.rollout_programs"), std::string::npos)
      << a.dump();
  EXPECT_EQ(NodeEntry(rollout, "node-b")["state"], "pending") << rollout.dump();
  EXPECT_EQ(NodeEntry(rollout, "node-c")["state"], "pending") << rollout.dump();

  const json s = nodes_[0]->WaitFor(
      [](const json& st) { return st["fleet"]["rollout"]["refused_programs"] == 1; },
      "node-a counts the refusal");
  EXPECT_EQ(s["fleet"]["rollout"]["refused_program"]["rollout"], "rollout-from-etcd") << s.dump();
  EXPECT_NE(
      nodes_[0]
          ->CtlPlain({"status"})
          .stdout_text.find(
              "fleet rollout rollout-from-etcd REFUSED on this node: rollout program /bin/sh"),
      std::string::npos);
  EXPECT_NE(nodes_[0]->Log().find("node node-a refuses to run /bin/sh"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(marker)) << "nothing of the rollout ran";
  for (const auto& node : nodes_) {
    const json st = node->WaitReady("the pair after the refused rollout");
    EXPECT_TRUE(st["upgrade"]["history"].empty()) << st["upgrade"].dump();
  }
  EXPECT_EQ(load_->failed(), 0) << "of " << load_->done() << " requests";
}

}  // namespace
}  // namespace baton::chaos
