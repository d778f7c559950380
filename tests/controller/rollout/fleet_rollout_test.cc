// FleetRollout (controller/rollout/fleet_rollout.h) against a real one-member etcd, its node's
// upgrades faked: a rollout whose program this node's configuration does not allow is refused
// before any canary starts, and the refusal is written as any refused step is (the node
// failed, with the reason), so that the rollout stops and rolls back instead of waiting on a
// node that will never upgrade; the refusal is counted in the node's snapshot. A canary whose
// start could not be written is not started again.
#include "controller/rollout/fleet_rollout.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "base/text/base64.h"
#include "fleet/fleet_records.h"
#include "tests/fleet/etcd_cluster.h"
#include "tests/fleet/fake_etcd_member.h"

namespace baton {
namespace {

using fleet_test::EtcdCluster;
using fleet_test::FakeEtcdMember;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kPrefix = "/baton/";
const std::vector<std::string> kOld = {"/opt/engine-v1", "--port", "{port}"};

// A node serving its old command, whose upgrades answer `start`.
// A node's record as its controller writes it (the fields a reader requires).
std::string NodeRecord(const std::string& node) {
  const nlohmann::json routes = {
      {"version", 1}, {"epoch", 1}, {"pair_state", "ready"}, {"entries", nlohmann::json::array()}};
  return nlohmann::json{{"node", node}, {"model", "tiny"}, {"routes", routes}}.dump();
}

class FakeUpgrades final : public LocalUpgrades {
 public:
  // `after_start`: what View() says once an upgrade was started (none: as before it).
  explicit FakeUpgrades(Status start, std::optional<LocalUpgrade> after_start = std::nullopt)
      : start_(std::move(start)), after_start_(std::move(after_start)) {}
  Result<LocalUpgrade> View() override {
    if (starts > 0 && after_start_.has_value()) return *after_start_;
    return LocalUpgrade{.active = kOld};
  }
  Status StartUpgrade(UpgradeRequest) override {
    ++starts;
    return start_;
  }
  Status StartRollback(UpgradeRequest) override { return OkStatus(); }
  Status CheckCommand(const std::vector<std::string>&) override { return OkStatus(); }
  std::atomic<int> starts{0};

 private:
  const Status start_;
  const std::optional<LocalUpgrade> after_start_;
};

class FleetRolloutRefusal : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
    cluster_ = std::make_unique<EtcdCluster>(1);
    ASSERT_TRUE(cluster_->WaitHealthy()) << "etcd did not come up:\n" << cluster_->LogTails();
    etcd_ = Client();
    ASSERT_NE(etcd_, nullptr);
    for (const char* node : {"node-a", "node-b"}) {
      ASSERT_TRUE(etcd_->Put(FleetNodesPrefix(kPrefix) + node, NodeRecord(node)).ok());
    }
  }
  // A client of the cluster, or of `endpoints` (the rollout's own: rollout_endpoints_).
  std::unique_ptr<EtcdClient> Client(std::vector<std::string> endpoints = {}) const {
    if (endpoints.empty()) endpoints = cluster_->endpoints();
    auto c = EtcdClient::Create({.endpoints = endpoints, .timeout = seconds(5)});
    return c.ok() ? std::move(*c) : nullptr;
  }
  // A rollout of `command` over node-a then node-b, as anyone who can write etcd writes it.
  void WriteRollout(const std::vector<std::string>& command) const {
    Rollout r;
    r.id = "rollout-1";
    r.command = command;
    r.started_by = "someone";
    r.created_ms = r.updated_ms = UnixMillisNow();
    for (const char* n : {"node-a", "node-b"}) r.nodes.push_back({.node = n});
    ASSERT_TRUE(etcd_->Put(FleetRolloutKey(kPrefix), RolloutRecord(r)).ok());
  }
  // node-a's FleetRollout until the rollout settles; returns the record then.
  Rollout RunUntilSettled(FakeUpgrades* local, const std::string& refuse,
                          RolloutSnapshot* snapshot) const {
    FleetRollout rollout(Client(rollout_endpoints_),
                         {.prefix = kPrefix,
                          .node = "node-a",
                          .poll = milliseconds(20),
                          .allow_command =
                              [&](const std::vector<std::string>& command) {
                                return command[0] == refuse
                                           ? FailedPrecondition("rollout program " + refuse +
                                                                " is not allowed on this node")
                                           : OkStatus();
                              }},
                         local);
    Rollout r;
    for (int i = 0; i < 500; ++i) {
      Result<std::optional<EtcdKeyValue>> kv = etcd_->Get(FleetRolloutKey(kPrefix));
      if (kv.ok() && kv->has_value()) {
        Result<Rollout> read = ParseRolloutRecord((*kv)->value);
        if (read.ok() && RolloutSettled(*read)) {
          r = *read;
          break;
        }
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    std::this_thread::sleep_for(milliseconds(100));  // the snapshot notes the settled record
    *snapshot = rollout.snapshot();
    return r;
  }

  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<EtcdClient> etcd_;
  std::vector<std::string> rollout_endpoints_;  // empty: the cluster's
};

TEST_F(FleetRolloutRefusal, AProgramNotAllowedFailsTheNodeAsARefusedUpgradeDoes) {
  WriteRollout({"/bin/sh", "-c", "touch /tmp/pwned"});
  FakeUpgrades local(OkStatus());
  RolloutSnapshot snap;
  const Rollout refused = RunUntilSettled(&local, "/bin/sh", &snap);
  EXPECT_EQ(local.starts, 0) << "no canary of a program the node does not allow";
  ASSERT_EQ(refused.state, RolloutState::kRolledBack) << RolloutRecord(refused);
  const NodeRollout* a = refused.Find("node-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->state, NodeRolloutState::kFailed);
  EXPECT_EQ(a->reason,
            "the upgrade was refused: rollout program /bin/sh is not allowed on this node");
  EXPECT_EQ(refused.Find("node-b")->state, NodeRolloutState::kPending) << "never started";
  EXPECT_NE(refused.reason.find("node node-a failed"), std::string::npos) << refused.reason;
  EXPECT_EQ(snap.refused_programs, 1u);
  EXPECT_EQ(snap.refused_rollout, "rollout-1");
  EXPECT_EQ(snap.refused_program, "rollout program /bin/sh is not allowed on this node");
  EXPECT_EQ(snap.steps, 0u);

  // The same rollout of an allowed program whose canary the node refuses ends alike.
  WriteRollout({"/opt/engine-v2", "--port", "{port}"});
  FakeUpgrades busy(FailedPrecondition("no standby"));
  const Rollout failed = RunUntilSettled(&busy, "/bin/sh", &snap);
  EXPECT_EQ(busy.starts, 1);
  EXPECT_EQ(failed.state, refused.state);
  EXPECT_EQ(failed.Find("node-a")->state, a->state);
  EXPECT_EQ(failed.Find("node-a")->reason, "the upgrade was refused: no standby");
  EXPECT_EQ(snap.refused_programs, 0u);
}

// A range answer under nodes/ that lists a key outside the prefix (a broken gateway or proxy)
// is read without it: the rollout thread goes on (it used to throw std::out_of_range and abort
// the controller) and the rollout settles as without that key.
TEST_F(FleetRolloutRefusal, AListedKeyOutsideTheNodesPrefixIsLeftOut) {
  const std::string nodes = Base64Encode(FleetNodesPrefix(kPrefix));
  FakeEtcdMember member(
      cluster_->endpoints()[0], nullptr,
      [&](const std::string& path, const nlohmann::json& request, nlohmann::json* answer) {
        if (path != "/v3/kv/range" || request.value("key", "") != nodes) return;
        (*answer)["kvs"].push_back({{"key", Base64Encode("/b")},
                                    {"value", Base64Encode("{}")},
                                    {"mod_revision", "1"},
                                    {"create_revision", "1"},
                                    {"version", "1"}});
      });
  ASSERT_TRUE(member.listening());
  rollout_endpoints_ = {member.endpoint()};
  WriteRollout({"/bin/sh", "-c", "true"});
  FakeUpgrades local(OkStatus());
  RolloutSnapshot snap;
  const Rollout refused = RunUntilSettled(&local, "/bin/sh", &snap);
  ASSERT_EQ(refused.state, RolloutState::kRolledBack) << RolloutRecord(refused);
  EXPECT_EQ(refused.Find("node-a")->state, NodeRolloutState::kFailed);
  EXPECT_EQ(snap.refused_programs, 1u);
}

// The write that says node-a's canary started is lost (etcd answers 503 once) and the canary
// ends, rolled back, before the next round: the node records the canary it started and its
// end, and never starts it a second time.
TEST_F(FleetRolloutRefusal, ACanaryWhoseStartWasNotWrittenIsNotStartedAgain) {
  std::atomic<bool> lost{false};
  FakeUpgrades local(OkStatus(), LocalUpgrade{.active = kOld,
                                              .last_outcome = UpgradeOutcome::kRolledBack,
                                              .last_reason = "the canary's error rate was 9%"});
  FakeEtcdMember member(
      cluster_->endpoints()[0],
      [&](const std::string& path, const nlohmann::json&) -> std::optional<fleet_test::FakeAnswer> {
        if (path != "/v3/kv/txn" || local.starts == 0 || lost.exchange(true)) {
          return std::nullopt;
        }
        return fleet_test::FakeAnswer{.status = 503, .body = "etcd is away"};
      });
  ASSERT_TRUE(member.listening());
  rollout_endpoints_ = {member.endpoint()};
  WriteRollout({"/opt/engine-v2", "--port", "{port}"});
  RolloutSnapshot snap;
  const Rollout ended = RunUntilSettled(&local, "/bin/sh", &snap);
  EXPECT_TRUE(lost) << "the write after the start was never refused";
  EXPECT_EQ(local.starts, 1) << "the canary was started again";
  ASSERT_EQ(ended.state, RolloutState::kRolledBack) << RolloutRecord(ended);
  const NodeRollout* a = ended.Find("node-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->state, NodeRolloutState::kRolledBack);
  EXPECT_EQ(a->reason, "the canary's error rate was 9%");
  EXPECT_EQ(ended.Find("node-b")->state, NodeRolloutState::kPending);
  EXPECT_GE(snap.etcd_failures, 1u);
}

}  // namespace
}  // namespace baton
