// A controller with [fleet] keeps its node's record in a real 3-member etcd cluster
// (docs/fleet.md): the record names the pair and follows a failover; `batonctl status` and
// /metrics show the registration; the record outlives a controller crash (the engines serve
// on) and the next controller writes it again; the whole etcd cluster going away stops
// nothing, and the node registers again when it comes back.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "fleet/etcd_client.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/fleet/etcd_cluster.h"

namespace baton::chaos {
namespace {

using fleet_test::EtcdCluster;
using std::chrono::milliseconds;

constexpr const char* kKey = "/baton-test/nodes/node-a";

std::string FleetToml(const EtcdCluster& etcd, int lease_ttl_ms = 2000) {
  std::string list;
  for (const std::string& e : etcd.endpoints()) list += (list.empty() ? "" : ",") + e;
  return "[fleet]\netcd = \"" + list +
         "\"\nprefix = \"/baton-test/\"\nnode = \"node-a\"\nmodel = \"tiny\"\n"
         "lease_ttl_ms = " +
         std::to_string(lease_ttl_ms) + "\netcd_timeout_ms = 300\n";
}

class FleetRegistration : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
    etcd_ = std::make_unique<EtcdCluster>(3);
    ASSERT_TRUE(etcd_->WaitHealthy()) << "etcd did not come up:\n" << etcd_->LogTails();
    auto c = EtcdClient::Create({.endpoints = etcd_->endpoints(), .timeout = milliseconds(300)});
    ASSERT_TRUE(c.ok());
    reader_ = std::move(*c);
  }
  // The node's record, or null when there is none (or etcd does not answer for 10 s: a read
  // that times out on a loaded host is tried again, so that a miss is not taken for none).
  json Record() const {
    const auto deadline = std::chrono::steady_clock::now() + milliseconds(10000);
    Result<std::optional<EtcdKeyValue>> kv = reader_->Get(kKey);
    while (!kv.ok() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(50));
      kv = reader_->Get(kKey);
    }
    if (!kv.ok() || !kv->has_value()) return nullptr;
    return json::parse((*kv)->value, nullptr, false);
  }
  // Waits until the record shows `primary` as the ready primary; returns the record.
  json WaitRecordPrimary(uint64_t primary) const {
    json r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      r = Record();
      if (r.is_object()) {
        for (const json& e : r["routes"]["entries"]) {
          if (e["role"] == "primary" && e["engine_id"] == primary && e["ready"] == true) return r;
        }
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    ADD_FAILURE() << "the record never showed primary " << primary << ": " << r.dump();
    return r;
  }

  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<EtcdClient> reader_;
};

TEST_F(FleetRegistration, TheRecordNamesThePairAndFollowsAFailover) {
  ClusterOptions o;
  o.extra_toml = FleetToml(*etcd_);
  ChaosCluster cluster(o);
  const uint64_t first = PrimaryId(cluster.Status());
  const json record = WaitRecordPrimary(first);
  EXPECT_EQ(record["node"], "node-a");
  EXPECT_EQ(record["model"], "tiny");
  EXPECT_EQ(record["controller"]["pid"], cluster.controller_pid());
  const json fleet = cluster.Status()["fleet"];
  EXPECT_EQ(fleet["key"], kKey);
  EXPECT_EQ(fleet["registered"], true);
  EXPECT_TRUE(fleet["etcd_error"].is_null());
  EXPECT_NE(cluster.CtlPlain({"status"})
                .stdout_text.find("fleet: node node-a as " + std::string(kKey) + ": registered"),
            std::string::npos);

  // The routes carry the version the route table was published with, as routers see it.
  const uint64_t version = record["routes"]["version"].get<uint64_t>();
  EXPECT_GE(version, 1u) << record.dump();

  ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
  const json after = WaitNewPrimary(cluster, first, "the pair after the kill");
  const json later = WaitRecordPrimary(PrimaryId(after));
  EXPECT_GT(later["routes"]["version"].get<uint64_t>(), version) << later.dump();
  cluster.CheckFencing();
}

TEST_F(FleetRegistration, TheRecordOutlivesAControllerCrashAndIsWrittenAgain) {
  ClusterOptions o;
  // Renewed every ttl/3: at least 6.7 s of the lease are left at the kill, time enough for
  // the read below on a loaded host.
  o.extra_toml = FleetToml(*etcd_, 10000);
  ChaosCluster cluster(o);
  const uint64_t primary = PrimaryId(cluster.Status());
  WaitRecordPrimary(primary);
  const pid_t old_pid = cluster.controller_pid();
  cluster.KillController();
  EXPECT_TRUE(Record().is_object());  // the lease runs on: the engines still serve
  cluster.RestartController();
  const json record = WaitRecordPrimary(primary);  // re-adopted: the same primary
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Record()["controller"]["pid"] == old_pid && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(Record()["controller"]["pid"], cluster.controller_pid());
  EXPECT_EQ(cluster.Status()["fleet"]["registered"], true);
  cluster.CheckFencing();
}

TEST_F(FleetRegistration, EtcdGoneStopsNothingAndTheNodeRegistersWhenItIsBack) {
  ClusterOptions o;
  o.extra_toml = FleetToml(*etcd_);
  ChaosCluster cluster(o);
  const uint64_t primary = PrimaryId(cluster.Status());
  WaitRecordPrimary(primary);
  for (int i = 0; i < etcd_->size(); ++i) etcd_->Kill(i);
  const json away = cluster.WaitFor(
      [](const json& s) { return s["fleet"].is_object() && !s["fleet"]["etcd_error"].is_null(); },
      "the controller notices etcd is gone");
  EXPECT_EQ(PrimaryId(away), primary);  // nothing was stopped
  EXPECT_EQ(away["pair"]["state"], "ready");
  std::this_thread::sleep_for(milliseconds(3000));  // past the lease's TTL
  EXPECT_EQ(PrimaryId(cluster.Status()), primary);
  for (int i = 0; i < etcd_->size(); ++i) etcd_->Start(i);
  ASSERT_TRUE(etcd_->WaitHealthy());
  WaitRecordPrimary(primary);
  cluster.WaitFor([](const json& s) { return s["fleet"]["etcd_error"].is_null(); },
                  "the controller sees etcd again");
  cluster.CheckFencing();
}

TEST(FleetConfig, BadFleetSettingsAreRefused) {
  ClusterOptions o;
  o.wait_ready = false;
  o.extra_toml = "[fleet]\netcd = \"127.0.0.1:1\"\nprefix = \"no-slash\"\n";
  ChaosCluster cluster(o);
  EXPECT_EQ(cluster.WaitControllerExit(std::chrono::seconds(20)) != 0, true);
  EXPECT_NE(cluster.Log().find("fleet.prefix: must start and end with '/'"), std::string::npos)
      << cluster.Log();
}

}  // namespace
}  // namespace baton::chaos
