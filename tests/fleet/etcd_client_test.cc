// EtcdClient against a real 3-member etcd cluster on loopback (tests/fleet/etcd_cluster.h):
// keys and prefixes (read in pages at one revision), leases that expire and take their keys, a
// client that moves to another member when its member dies, and the errors of an unreachable
// cluster.
#include "fleet/etcd_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "tests/fleet/etcd_cluster.h"
#include "tests/fleet/fake_etcd_member.h"

namespace baton {
namespace {

using fleet_test::EtcdCluster;
using fleet_test::FakeAnswer;
using fleet_test::FakeEtcdMember;
using std::chrono::milliseconds;
using std::chrono::seconds;

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
    cluster_ = std::make_unique<EtcdCluster>(3);
    ASSERT_TRUE(cluster_->WaitHealthy()) << "etcd did not come up:\n" << cluster_->LogTails();
    auto c = EtcdClient::Create({.endpoints = cluster_->endpoints(), .timeout = milliseconds(500)});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }

  // Get, tried again while it fails (a timeout on a loaded host) for up to 10 s.
  Result<std::optional<EtcdKeyValue>> Read(const std::string& key) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    Result<std::optional<EtcdKeyValue>> r = client_->Get(key);
    while (!r.ok() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(50));
      r = client_->Get(key);
    }
    return r;
  }
  // KeepAlive, sent again while it fails otherwise than NotFound (a timeout on a loaded host)
  // for up to `limit`.
  Result<int64_t> Renew(int64_t lease, milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    Result<int64_t> ttl = client_->KeepAlive(lease);
    while (!ttl.ok() && ttl.status().code() != StatusCode::kNotFound &&
           std::chrono::steady_clock::now() < deadline) {
      ttl = client_->KeepAlive(lease);
    }
    return ttl;
  }
  // Whether etcd answered that `key` holds a value, or that it holds none.
  bool Holds(const std::string& key) {
    Result<std::optional<EtcdKeyValue>> r = Read(key);
    return r.ok() && r->has_value();
  }
  bool Lacks(const std::string& key) {
    Result<std::optional<EtcdKeyValue>> r = Read(key);
    return r.ok() && !r->has_value();
  }
  // The value etcd holds at `key`; "" (with a test failure) when it holds none or does not
  // answer.
  std::string ValueAt(const std::string& key) {
    Result<std::optional<EtcdKeyValue>> r = Read(key);
    if (!r.ok() || !r->has_value()) {
      ADD_FAILURE() << key << ": " << (r.ok() ? "no value" : r.status().ToString());
      return "";
    }
    return (*r)->value;
  }

  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, KeysAndPrefixes) {
  const std::string binary("v\0\xff\x01", 4);
  ASSERT_TRUE(client_->Put("/baton/nodes/a", "alpha").ok());
  ASSERT_TRUE(client_->Put("/baton/nodes/b", binary).ok());
  ASSERT_TRUE(client_->Put("/baton/other", "x").ok());
  Result<std::optional<EtcdKeyValue>> a = Read("/baton/nodes/a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, "alpha");
  EXPECT_EQ((*a)->version, 1);
  Result<EtcdRange> nodes = client_->GetPrefix("/baton/nodes/");
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  ASSERT_EQ(nodes->kvs.size(), 2u);
  EXPECT_EQ(nodes->kvs[0].key, "/baton/nodes/a");
  EXPECT_EQ(nodes->kvs[1].value, binary);
  EXPECT_GE(nodes->revision, nodes->kvs[1].mod_revision);
  EXPECT_TRUE(Lacks("/baton/nodes/none"));
  EXPECT_EQ(*client_->DeletePrefix("/baton/nodes/"), 2);
  EXPECT_TRUE(client_->GetPrefix("/baton/nodes/")->kvs.empty());
  EXPECT_EQ(*client_->Delete("/baton/other"), 1);
}

// GetPrefix reads a prefix in pages of range_page keys, every page at the first one's
// revision: a key written between two pages is not in the answer, which is the prefix as it
// was when the first page was read, and the next reading has it.
TEST_F(EtcdClientTest, APrefixIsReadInPagesAtOneRevision) {
  for (int i = 0; i < 25; ++i) {
    char key[16];
    std::snprintf(key, sizeof(key), "/p/%02d", i);
    ASSERT_TRUE(client_->Put(key, std::to_string(i)).ok());
  }
  ASSERT_TRUE(client_->Put("/p0", "outside").ok());
  std::atomic<int> ranges{0};
  FakeEtcdMember member(
      cluster_->endpoints()[0], [&](const std::string& path, const nlohmann::json& request) {
        if (path == "/v3/kv/range" && request.contains("limit") && ++ranges == 2) {
          EXPECT_TRUE(client_->Put("/p/zz", "late").ok());
        }
        return std::optional<FakeAnswer>();
      });
  ASSERT_TRUE(member.listening());
  auto paged = EtcdClient::Create(
      {.endpoints = {member.endpoint()}, .timeout = seconds(5), .range_page = 10});
  ASSERT_TRUE(paged.ok()) << paged.status().ToString();
  Result<EtcdRange> all = (*paged)->GetPrefix("/p/");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(ranges, 3);
  ASSERT_EQ(all->kvs.size(), 25u);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(all->kvs[i].value, std::to_string(i));
  Result<EtcdRange> again = (*paged)->GetPrefix("/p/");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->kvs.size(), 26u);
  EXPECT_EQ(again->kvs.back().key, "/p/zz");
  EXPECT_GT(again->revision, all->revision);
  EXPECT_EQ(EtcdClient::Create({.endpoints = {member.endpoint()}, .range_page = 0}).status().code(),
            StatusCode::kInvalidArgument);
}

// A member that says more keys follow but whose page does not move on is an error, not a
// reading that never ends.
TEST_F(EtcdClientTest, APageThatDoesNotMoveOnIsAnError) {
  ASSERT_TRUE(client_->Put("/p/a", "1").ok());
  FakeEtcdMember member(cluster_->endpoints()[0], nullptr,
                        [](const std::string& path, const nlohmann::json&, nlohmann::json* answer) {
                          if (path == "/v3/kv/range") (*answer)["more"] = true;
                        });
  ASSERT_TRUE(member.listening());
  auto c = EtcdClient::Create({.endpoints = {member.endpoint()}, .timeout = seconds(5)});
  ASSERT_TRUE(c.ok());
  Result<EtcdRange> r = (*c)->GetPrefix("/p/");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the page does not move on"), std::string::npos)
      << r.status().ToString();
}

// Compare-and-put writes only over the revision it read: of two writers that read the same
// revision, one wins and the other is told, with nothing written, and reads again.
TEST_F(EtcdClientTest, CompareAndPutWritesOnlyOverTheRevisionItRead) {
  Result<std::optional<int64_t>> created = client_->CompareAndPut("/baton/rollout", "one", 0);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ASSERT_TRUE(created->has_value()) << "0: the key must not exist, and it did not";
  Result<std::optional<int64_t>> again = client_->CompareAndPut("/baton/rollout", "other", 0);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value()) << "the key exists now";
  Result<std::optional<EtcdKeyValue>> read = Read("/baton/rollout");
  ASSERT_TRUE(read.ok() && read->has_value());
  EXPECT_EQ((*read)->value, "one");
  EXPECT_EQ((*read)->mod_revision, **created);

  const int64_t seen = (*read)->mod_revision;
  Result<std::optional<int64_t>> first = client_->CompareAndPut("/baton/rollout", "two", seen);
  Result<std::optional<int64_t>> second = client_->CompareAndPut("/baton/rollout", "three", seen);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(first->has_value());
  EXPECT_GT(**first, seen);
  EXPECT_FALSE(second->has_value()) << "the second writer read a revision that moved on";
  EXPECT_EQ(ValueAt("/baton/rollout"), "two");

  Result<bool> stale = client_->CompareAndDelete("/baton/rollout", seen);
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(*stale);
  Result<bool> deleted = client_->CompareAndDelete("/baton/rollout", **first);
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(*deleted);
  EXPECT_TRUE(Lacks("/baton/rollout"));
  EXPECT_FALSE(*client_->CompareAndDelete("/baton/rollout", **first)) << "gone already";
}

// A 3 s lease renewed every 0.5 s, with room for a renewal that a loaded host delays or that
// times out and is sent again.
TEST_F(EtcdClientTest, ALeaseKeptAliveKeepsItsKeyAndAnExpiredOneTakesIt) {
  Result<int64_t> lease = client_->GrantLease(seconds(3));
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(client_->Put("/baton/leased", "here", *lease).ok());
  Result<std::optional<EtcdKeyValue>> leased = Read("/baton/leased");
  ASSERT_TRUE(leased.ok() && leased->has_value());
  EXPECT_EQ((*leased)->lease, *lease);
  for (int i = 0; i < 9; ++i) {  // 4.5 s of renewals: longer than the TTL
    Result<int64_t> ttl = Renew(*lease, milliseconds(1500));
    ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
    EXPECT_GE(*ttl, 1);
    std::this_thread::sleep_for(milliseconds(500));
  }
  EXPECT_TRUE(Holds("/baton/leased"));
  // No more renewals: etcd expires the lease and deletes its key.
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  bool gone = false;
  while (!gone && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
    gone = Lacks("/baton/leased");
  }
  EXPECT_TRUE(gone);
  EXPECT_EQ(Renew(*lease, milliseconds(10000)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(client_->RevokeLease(*lease).code(), StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, ARevokedLeaseTakesItsKeysAtOnce) {
  Result<int64_t> lease = client_->GrantLease(seconds(30));
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client_->Put("/baton/r", "x", *lease).ok());
  ASSERT_TRUE(client_->RevokeLease(*lease).ok());
  EXPECT_TRUE(Lacks("/baton/r"));
}

TEST_F(EtcdClientTest, TheClientMovesToAnotherMemberWhenItsMemberDies) {
  ASSERT_TRUE(client_->Put("/baton/k", "1").ok());
  const std::string first = client_->endpoint();
  int dead = -1;
  for (int i = 0; i < cluster_->size(); ++i) {
    if (cluster_->member(i).client_url() == first) dead = i;
  }
  ASSERT_GE(dead, 0);
  cluster_->Kill(dead);
  // The two left are a quorum: writes go on, through another member.
  Status put = Unavailable("not tried");
  for (int i = 0; i < 100 && !put.ok(); ++i) {
    put = client_->Put("/baton/k", "2").status();
    if (!put.ok()) std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_TRUE(put.ok()) << put.ToString();
  EXPECT_NE(client_->endpoint(), first);
  EXPECT_EQ(ValueAt("/baton/k"), "2");
  // The member comes back on its data and catches up.
  cluster_->Start(dead);
  ASSERT_TRUE(cluster_->WaitHealthy());
  auto only = EtcdClient::Create({.endpoints = {first}, .timeout = milliseconds(500)});
  ASSERT_TRUE(only.ok());
  Result<std::optional<EtcdKeyValue>> again = (*only)->Get("/baton/k");
  for (int i = 0; i < 100 && !(again.ok() && again->has_value() && (*again)->value == "2"); ++i) {
    std::this_thread::sleep_for(milliseconds(50));
    again = (*only)->Get("/baton/k");
  }
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->value, "2");
}

TEST_F(EtcdClientTest, AFrozenMemberIsPassedOverAfterTheTimeout) {
  const std::string first = client_->endpoint();
  int frozen = 0;
  for (int i = 0; i < cluster_->size(); ++i) {
    if (cluster_->member(i).client_url() == first) frozen = i;
  }
  cluster_->Freeze(frozen);
  Status put = Unavailable("not tried");
  for (int i = 0; i < 20 && !put.ok(); ++i) put = client_->Put("/baton/f", "1").status();
  cluster_->Thaw(frozen);
  ASSERT_TRUE(put.ok()) << put.ToString();
  EXPECT_NE(client_->endpoint(), first);
}

// A member that answers as no healthy etcd does (a proxy's page, HTTP 429, a 5xx of no JSON)
// is passed over like one that cannot be reached: the call goes on to the next member. Only
// etcd's own JSON errors end a call.
TEST_F(EtcdClientTest, AMemberAnsweringBrokenIsPassedOver) {
  auto broken = [](FakeAnswer a) {
    return [a](const std::string&, const nlohmann::json&) { return std::optional<FakeAnswer>(a); };
  };
  FakeEtcdMember page("", broken({200, "<html>proxy</html>"}));
  FakeEtcdMember busy("", broken({429, R"({"error":"etcdserver: too many requests"})"}));
  FakeEtcdMember failing("", broken({500, "internal error"}));
  ASSERT_TRUE(page.listening() && busy.listening() && failing.listening());
  for (const FakeEtcdMember* first : {&page, &busy, &failing}) {
    auto c = EtcdClient::Create(
        {.endpoints = {first->endpoint(), cluster_->endpoints()[0]}, .timeout = seconds(5)});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    Result<int64_t> put = (*c)->Put("/t/k", "v");
    ASSERT_TRUE(put.ok()) << first->endpoint() << ": " << put.status().ToString();
    Result<std::optional<EtcdKeyValue>> got = (*c)->Get("/t/k");
    ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  }
  // An answer of etcd's JSON API that lacks a field names the member and the path.
  FakeEtcdMember empty("", broken({200, "{}"}));
  ASSERT_TRUE(empty.listening());
  auto c = EtcdClient::Create({.endpoints = {empty.endpoint()}, .timeout = seconds(5)});
  ASSERT_TRUE(c.ok());
  Result<int64_t> put = (*c)->Put("/t/k", "v");
  ASSERT_FALSE(put.ok());
  EXPECT_NE(put.status().message().find(empty.endpoint() + "/v3/kv/put"), std::string::npos)
      << put.status().ToString();
}

TEST(EtcdClientErrors, NoMemberListeningIsUnavailable) {
  const int port = fleet_test::FreePort("127.0.0.1");
  auto c = EtcdClient::Create(
      {.endpoints = {"127.0.0.1:" + std::to_string(port)}, .timeout = milliseconds(300)});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Put("k", "v").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*c)->GrantLease(seconds(0)).status().code(), StatusCode::kInvalidArgument);
}

TEST(EtcdClientErrors, BadEndpointsAreRefused) {
  EXPECT_FALSE(EtcdClient::Create({.endpoints = {}}).ok());
  EXPECT_FALSE(EtcdClient::Create({.endpoints = {"no-port"}}).ok());
  EXPECT_FALSE(EtcdClient::Create({.endpoints = {"https://127.0.0.1:2379"}}).ok());
}

TEST(EtcdPrefixEnd, IsThePrefixWithItsLastByteRaised) {
  EXPECT_EQ(EtcdPrefixEnd("/baton/"), "/baton0");
  EXPECT_EQ(EtcdPrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(EtcdPrefixEnd(""), std::string(1, '\0'));
}

}  // namespace
}  // namespace baton
