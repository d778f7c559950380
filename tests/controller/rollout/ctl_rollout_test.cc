// `batonctl fleet upgrade` on the controller's side (controller/rollout/ctl_rollout.h) against
// a real one-member etcd: a rollout written by another batonctl between this one's read and
// its write is never taken for its own, even with the same id and start time; ids differ per
// invocation; and an engine command that could not be launched here, or holds an unknown
// placeholder, is refused before any rollout is written.
#include "controller/rollout/ctl_rollout.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "controller/engines/supervisor.h"
#include "fleet/fleet_records.h"
#include "tests/fleet/etcd_cluster.h"

namespace baton {
namespace {

using fleet_test::EtcdCluster;
using std::chrono::seconds;

constexpr const char* kPrefix = "/baton/";

// A node's record as its controller writes it (the fields a reader requires).
std::string NodeRecord(const std::string& node) {
  const nlohmann::json routes = {
      {"version", 1}, {"epoch", 1}, {"pair_state", "ready"}, {"entries", nlohmann::json::array()}};
  return nlohmann::json{{"node", node}, {"model", "tiny"}, {"routes", routes}}.dump();
}

class FleetUpgradeCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
    cluster_ = std::make_unique<EtcdCluster>(1);
    ASSERT_TRUE(cluster_->WaitHealthy()) << "etcd did not come up:\n" << cluster_->LogTails();
    // A request's timeout: long enough for a WAL fsync on a machine busy with other I/O.
    auto c = EtcdClient::Create({.endpoints = cluster_->endpoints(), .timeout = seconds(5)});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    etcd_ = std::move(*c);
    for (const char* node : {"node-a", "node-b", "node-c"}) {
      ASSERT_TRUE(etcd_->Put(FleetNodesPrefix(kPrefix) + node, NodeRecord(node)).ok());
    }
  }
  FleetCtlContext Context(const std::string& node) const {
    return FleetCtlContext{.etcd = etcd_.get(), .prefix = kPrefix, .node = node};
  }
  // A new rollout as `fleet upgrade` on `node` makes it at `ms`.
  static Rollout NewRollout(const std::string& node, int64_t ms, const std::string& id) {
    Rollout r;
    r.id = id;
    r.command = {"/opt/engine-v2", "--port", "{port}"};
    r.started_by = node;
    r.created_ms = r.updated_ms = ms;
    for (const char* n : {"node-a", "node-b", "node-c"}) r.nodes.push_back({.node = n});
    return r;
  }
  std::optional<std::string> Record() const {
    Result<std::optional<EtcdKeyValue>> kv = etcd_->Get(FleetRolloutKey(kPrefix));
    if (!kv.ok() || !kv->has_value()) return std::nullopt;
    return (*kv)->value;
  }

  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<EtcdClient> etcd_;
};

// Two batonctl on two nodes read "no rollout" (revision 0) in the same millisecond; node-a's
// write lands first. node-b's compare-and-put finds the key moved on: the record there is not
// what node-b wrote, whatever its id, so node-b is refused and the record stays node-a's.
TEST_F(FleetUpgradeCommand, ARolloutWrittenMeanwhileWithTheSameIdIsNotTakenForOwnWrite) {
  const Rollout a = NewRollout("node-a", 1796200000123, "rollout-1796200000123");
  const Rollout b = NewRollout("node-b", 1796200000123, "rollout-1796200000123");
  ASSERT_TRUE(PutNewRollout(Context("node-a"), a, 0).ok());
  const Status lost = PutNewRollout(Context("node-b"), b, 0);
  EXPECT_EQ(lost.code(), StatusCode::kFailedPrecondition) << lost.ToString();
  EXPECT_NE(lost.message().find("the rollout record changed meanwhile (another batonctl?)"),
            std::string::npos)
      << lost.ToString();
  EXPECT_EQ(Record(), RolloutRecord(a));
}

// A write that etcd applied although the call failed over to another member finds its own
// record there: that counts as written.
TEST_F(FleetUpgradeCommand, ItsOwnRecordFoundAfterAConflictCountsAsWritten) {
  const Rollout a = NewRollout("node-a", 1796200000123, "rollout-1796200000123-node-a-0f0f0f0f");
  ASSERT_TRUE(etcd_->Put(FleetRolloutKey(kPrefix), RolloutRecord(a)).ok());
  EXPECT_TRUE(PutNewRollout(Context("node-a"), a, 0).ok());
  EXPECT_EQ(Record(), RolloutRecord(a));
}

TEST_F(FleetUpgradeCommand, IdsDifferPerInvocationInTheSameMillisecond) {
  Result<std::string> a = NewRolloutId(1796200000123, "node-a");
  Result<std::string> again = NewRolloutId(1796200000123, "node-a");
  Result<std::string> b = NewRolloutId(1796200000123, "node-b");
  ASSERT_TRUE(a.ok() && again.ok() && b.ok());
  EXPECT_EQ(a->rfind("rollout-1796200000123-node-a-", 0), 0u) << *a;
  EXPECT_NE(*a, *again);
  EXPECT_NE(*a, *b);
}

// The program is checked as `batonctl upgrade` checks it (Supervisor::CheckCommand), on the
// node batonctl asked, before the record is written: no rollout starts to roll back at once.
TEST_F(FleetUpgradeCommand, AProgramThatIsNotThereIsRefusedBeforeAnyRolloutIsWritten) {
  const Supervisor sup({"/bin/true"}, "/run/c.sock", "/m", "/run", "");
  FleetCtlContext ctx = Context("node-a");
  ctx.check_command = [&](const std::vector<std::string>& c) { return sup.CheckCommand(c); };
  proto::CtlReply reply =
      HandleFleetCommand(ctx, {"upgrade", "--", "/nonexistent/engine", "--port", "{port}"});
  EXPECT_EQ(reply.exit_code, 1u) << reply.text;
  EXPECT_EQ(reply.text, "refused: engine program /nonexistent/engine: No such file or directory");
  EXPECT_EQ(Record(), std::nullopt);

  reply = HandleFleetCommand(ctx, {"upgrade", "--", "/bin/true", "--port", "{bogus}"});
  EXPECT_EQ(reply.exit_code, 2u) << reply.text;
  EXPECT_NE(reply.text.find("unknown placeholder {bogus}"), std::string::npos) << reply.text;
  EXPECT_EQ(Record(), std::nullopt);

  reply = HandleFleetCommand(ctx, {"upgrade", "--", "/bin/true", "--port", "{port}"});
  EXPECT_EQ(reply.exit_code, 0u) << reply.text;
  ASSERT_TRUE(Record().has_value());
  Result<Rollout> written = ParseRolloutRecord(*Record());
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(written->id.rfind("rollout-", 0), 0u);
  EXPECT_NE(written->id.find("-node-a-"), std::string::npos) << written->id;
  EXPECT_EQ(written->nodes.size(), 3u);
}

// Only keys whose record parses and names the key's node are the fleet's nodes: a key of
// garbage, an empty record or a record of another node under nodes/ is no node the rollout
// waits for (no controller would ever act for it: the rollout would run for ever).
TEST_F(FleetUpgradeCommand, OnlyKeysWithTheirNodesRecordAreTheRolloutsNodes) {
  ASSERT_TRUE(etcd_->Put(FleetNodesPrefix(kPrefix) + "garbage", "not json").ok());
  ASSERT_TRUE(etcd_->Put(FleetNodesPrefix(kPrefix) + "empty", "{}").ok());
  ASSERT_TRUE(etcd_->Put(FleetNodesPrefix(kPrefix) + "zzz", NodeRecord("node-a")).ok());
  proto::CtlReply reply =
      HandleFleetCommand(Context("node-a"), {"upgrade", "--", "/bin/true", "--port", "{port}"});
  ASSERT_EQ(reply.exit_code, 0u) << reply.text;
  ASSERT_TRUE(Record().has_value());
  Result<Rollout> written = ParseRolloutRecord(*Record());
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  std::vector<std::string> nodes;
  for (const NodeRollout& n : written->nodes) nodes.push_back(n.node);
  EXPECT_EQ(nodes, (std::vector<std::string>{"node-a", "node-b", "node-c"}));
}

}  // namespace
}  // namespace baton
