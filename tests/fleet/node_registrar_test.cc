// NodeRegistrar against a real 3-member etcd cluster: the record is kept past its TTL, is
// replaced when published again, comes back under a new lease when its lease is lost,
// survives the whole cluster going away and coming back, and outlives the registrar by its
// TTL only.
#include "fleet/node_registrar.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "tests/fleet/etcd_cluster.h"
#include "tests/fleet/fake_etcd_member.h"

namespace baton {
namespace {

using fleet_test::EtcdCluster;
using std::chrono::milliseconds;

constexpr const char* kKey = "/baton/nodes/node-a";

bool Eventually(const std::function<bool()>& done, milliseconds wait = milliseconds(15000)) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return true;
}

class NodeRegistrarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
    cluster_ = std::make_unique<EtcdCluster>(3);
    ASSERT_TRUE(cluster_->WaitHealthy()) << "etcd did not come up:\n" << cluster_->LogTails();
    registrar_etcd_ = Client();
    reader_ = Client();
  }
  std::unique_ptr<EtcdClient> Client() {
    // A second: a renewal etcd answers late on a loaded host is not taken for a lost one.
    auto c =
        EtcdClient::Create({.endpoints = cluster_->endpoints(), .timeout = milliseconds(1000)});
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // The record at kKey (nullopt: none). A read that etcd does not answer (a timeout on a
  // loaded host) is tried again, for up to 10 s, so that a miss is never taken for an absence.
  std::optional<EtcdKeyValue> Read() {
    const auto deadline = std::chrono::steady_clock::now() + milliseconds(10000);
    Result<std::optional<EtcdKeyValue>> r = reader_->Get(kKey);
    while (!r.ok() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(50));
      r = reader_->Get(kKey);
    }
    if (!r.ok()) {
      ADD_FAILURE() << "etcd did not answer a read: " << r.status().ToString();
      return std::nullopt;
    }
    return *r;
  }
  // The record's lease; 0 when there is no record.
  int64_t Lease() {
    const std::optional<EtcdKeyValue> kv = Read();
    return kv.has_value() ? kv->lease : 0;
  }
  bool Holds(const std::string& value) {
    const std::optional<EtcdKeyValue> kv = Read();
    return kv.has_value() && kv->value == value;
  }

  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<EtcdClient> registrar_etcd_, reader_;
};

TEST_F(NodeRegistrarTest, TheRecordIsKeptPastItsTtlAndReplacedWhenPublished) {
  NodeRegistrar registrar(registrar_etcd_.get(), {.key = kKey, .ttl = milliseconds(2000)});
  registrar.Publish("r1");
  ASSERT_TRUE(Eventually([&] { return Holds("r1"); }));
  const int64_t lease = Lease();
  ASSERT_NE(lease, 0);
  std::this_thread::sleep_for(milliseconds(3000));  // one and a half TTLs of renewals
  ASSERT_TRUE(Holds("r1"));
  EXPECT_EQ(Lease(), lease);
  registrar.Publish("r2");
  ASSERT_TRUE(Eventually([&] { return Holds("r2"); }));
  // The registrar counts a write once etcd answered it, which a reader may see first.
  ASSERT_TRUE(Eventually([&] { return registrar.state().writes >= 2; }));
  const NodeRegistration s = registrar.state();
  EXPECT_TRUE(s.registered);
  EXPECT_EQ(s.leases, 1u);
  EXPECT_EQ(s.writes, 2u);
  EXPECT_EQ(s.last_error, "");
}

TEST_F(NodeRegistrarTest, ALostLeaseIsReplacedAndTheRecordWrittenAgain) {
  NodeRegistrar registrar(registrar_etcd_.get(), {.key = kKey, .ttl = milliseconds(3000)});
  registrar.Publish("r1");
  ASSERT_TRUE(Eventually([&] { return Holds("r1"); }));
  const int64_t lease = Lease();
  ASSERT_NE(lease, 0);
  ASSERT_TRUE(reader_->RevokeLease(lease).ok());  // the key goes with it
  ASSERT_TRUE(Eventually([&] {
    const std::optional<EtcdKeyValue> kv = Read();
    return kv.has_value() && kv->lease != lease && kv->value == "r1";
  }));
  EXPECT_EQ(registrar.state().leases, 2u);
}

TEST_F(NodeRegistrarTest, TheWholeClusterGoneAndBackIsWaitedOut) {
  NodeRegistrar registrar(registrar_etcd_.get(), {.key = kKey, .ttl = milliseconds(3000)});
  registrar.Publish("r1");
  ASSERT_TRUE(Eventually([&] { return Holds("r1"); }));
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Kill(i);
  ASSERT_TRUE(Eventually([&] { return !registrar.state().last_error.empty(); }));
  registrar.Publish("r2");  // while etcd is away
  std::this_thread::sleep_for(milliseconds(1500));
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Start(i);
  ASSERT_TRUE(cluster_->WaitHealthy());
  ASSERT_TRUE(Eventually([&] { return Holds("r2"); }));
  ASSERT_TRUE(Eventually([&] { return registrar.state().last_error.empty(); }));
  EXPECT_TRUE(registrar.state().registered);
  EXPECT_GT(registrar.state().failures, 0u);
}

TEST_F(NodeRegistrarTest, TheRecordOutlivesTheRegistrarByItsTtlOnly) {
  {
    // Renewed every ttl/3: at least 3.3 s of the lease are left once the registrar is gone,
    // time enough for the read below on a loaded host.
    NodeRegistrar registrar(registrar_etcd_.get(), {.key = kKey, .ttl = milliseconds(5000)});
    registrar.Publish("r1");
    ASSERT_TRUE(Eventually([&] { return Holds("r1"); }));
  }
  EXPECT_TRUE(Holds("r1"));  // not revoked: the node's engines may still serve
  EXPECT_TRUE(Eventually([&] { return !Read().has_value(); }));
}

// Deleted by hand (etcdctl del): written again at the next renewal, not left gone while the
// node says it is registered.
TEST_F(NodeRegistrarTest, ADeletedRecordIsWrittenAgain) {
  NodeRegistrar registrar(registrar_etcd_.get(), {.key = kKey, .ttl = milliseconds(3000)});
  registrar.Publish("r1");
  ASSERT_TRUE(Eventually([&] { return Holds("r1"); }));
  ASSERT_TRUE(reader_->Delete(kKey).ok());
  ASSERT_TRUE(Eventually([&] { return Holds("r1"); }));
  ASSERT_TRUE(Eventually([&] { return registrar.state().registered; }));
  EXPECT_EQ(registrar.state().leases, 1u) << "the same lease: only the record had gone";
}

// Two registrars on one key (two controllers with one fleet.node): the one whose key the
// other took says so and is not registered; once the other is gone and its lease with it, it
// writes its record again.
TEST_F(NodeRegistrarTest, AKeyAnotherWriterTookIsReportedThenTakenBackWhenFree) {
  NodeRegistrar first(registrar_etcd_.get(), {.key = kKey, .ttl = milliseconds(3000)});
  first.Publish("first");
  ASSERT_TRUE(Eventually([&] { return Holds("first") && first.state().registered; }));
  std::unique_ptr<EtcdClient> other_etcd = Client();
  {
    NodeRegistrar second(other_etcd.get(), {.key = kKey, .ttl = milliseconds(3000)});
    second.Publish("second");
    ASSERT_TRUE(Eventually([&] { return Holds("second"); }));
    ASSERT_TRUE(Eventually([&] { return !first.state().conflict.empty(); }));
    const NodeRegistration s = first.state();
    EXPECT_FALSE(s.registered);
    EXPECT_NE(s.conflict.find("another controller uses the same fleet.node"), std::string::npos)
        << s.conflict;
    std::this_thread::sleep_for(milliseconds(1500));  // renewals of both
    EXPECT_TRUE(Holds("second")) << "the first does not write the key back while it is held";
  }
  // The second's lease runs out (3 s), its record with it: the first writes its own again.
  ASSERT_TRUE(Eventually([&] { return Holds("first"); }));
  ASSERT_TRUE(Eventually([&] { return first.state().registered; }));
  EXPECT_EQ(first.state().conflict, "");
}

// A record written without a lease (etcdctl put by hand) is no controller's and never
// expires: the registrar replaces it by compare-and-put instead of taking it for another
// controller's for ever.
TEST_F(NodeRegistrarTest, ARecordWrittenWithoutALeaseIsReplaced) {
  NodeRegistrar registrar(registrar_etcd_.get(), {.key = kKey, .ttl = milliseconds(3000)});
  registrar.Publish("r1");
  ASSERT_TRUE(Eventually([&] { return Holds("r1") && registrar.state().registered; }));
  const int64_t lease = Lease();
  ASSERT_TRUE(reader_->Put(kKey, "by hand").ok());
  ASSERT_TRUE(Eventually([&] { return Holds("r1"); }));
  EXPECT_EQ(Lease(), lease);
  ASSERT_TRUE(Eventually([&] { return registrar.state().registered; }));
  EXPECT_EQ(registrar.state().conflict, "");
}

// A slow etcd (800 ms a call: a round of renewal and read-back takes 1.6 s) keeps the key
// under a 2 s lease: each renewal is due TTL/3 after the start of the last one, not TTL/3
// after the round's end (2.3 s apart: the lease expired between them).
TEST_F(NodeRegistrarTest, ASlowEtcdKeepsTheKeyUnderItsLease) {
  fleet_test::FakeEtcdMember slow(cluster_->endpoints()[0],
                                  [](const std::string&, const nlohmann::json&) {
                                    std::this_thread::sleep_for(milliseconds(800));
                                    return std::optional<fleet_test::FakeAnswer>();
                                  });
  ASSERT_TRUE(slow.listening());
  auto c = EtcdClient::Create({.endpoints = {slow.endpoint()}, .timeout = milliseconds(3000)});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  NodeRegistrar registrar(c->get(), {.key = kKey, .ttl = milliseconds(2000)});
  registrar.Publish("r1");
  ASSERT_TRUE(Eventually([&] { return Holds("r1"); }));
  int missing = 0;
  for (int i = 0; i < 60; ++i) {  // 6 s: three TTLs
    if (!Holds("r1")) ++missing;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(registrar.state().leases, 1u);
}

}  // namespace
}  // namespace baton
