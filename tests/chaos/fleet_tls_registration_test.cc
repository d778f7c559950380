// A controller whose [fleet] has the etcd TLS keys (docs/fleet.md, Security) registers its
// node's record in an etcd member that serves its client port over TLS only and asks every
// client for a certificate of its CA; the record follows a failover as over plain HTTP.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "fleet/etcd_client.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/fleet/etcd_cluster.h"

namespace baton::chaos {
namespace {

using fleet_test::EtcdCluster;
using std::chrono::milliseconds;

constexpr const char* kKey = "/baton-tls/nodes/node-t";

TEST(FleetTlsRegistration, AControllerWithTheTlsKeysRegistersItsNode) {
  ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
  EtcdCluster etcd(1, /*tls=*/true);
  ASSERT_TRUE(etcd.certs().has_value()) << "openssl failed; see " << etcd.dir() << "/pki";
  ASSERT_TRUE(etcd.WaitHealthy()) << "etcd did not come up:\n" << etcd.LogTails();
  auto reader = EtcdClient::Create(
      {.endpoints = etcd.endpoints(), .timeout = milliseconds(500), .tls = etcd.client_tls()});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();

  const TlsClientOptions tls = etcd.client_tls();
  ClusterOptions o;
  o.extra_toml = "[fleet]\netcd = \"" + etcd.endpoints().front() +
                 "\"\nprefix = \"/baton-tls/\"\nnode = \"node-t\"\nmodel = \"tiny\"\n"
                 "lease_ttl_ms = 2000\netcd_timeout_ms = 500\n"
                 "etcd_ca_file = \"" +
                 tls.ca_file + "\"\netcd_cert_file = \"" + tls.cert_file +
                 "\"\netcd_key_file = \"" + tls.key_file + "\"\n";
  ChaosCluster cluster(o);
  auto record_primary = [&](uint64_t primary) {
    json r;
    for (int i = 0; i < 300; ++i) {
      Result<std::optional<EtcdKeyValue>> kv = (*reader)->Get(kKey);
      if (kv.ok() && kv->has_value()) r = json::parse((*kv)->value, nullptr, false);
      if (r.is_object()) {
        for (const json& e : r["routes"]["entries"]) {
          if (e["role"] == "primary" && e["engine_id"] == primary && e["ready"] == true) return r;
        }
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    ADD_FAILURE() << "the record never showed primary " << primary << ": " << r.dump();
    return r;
  };
  const uint64_t first = PrimaryId(cluster.Status());
  const json record = record_primary(first);
  EXPECT_EQ(record["node"], "node-t");
  EXPECT_EQ(record["controller"]["pid"], cluster.controller_pid());
  const json fleet = cluster.Status()["fleet"];
  EXPECT_EQ(fleet["registered"], true);
  EXPECT_TRUE(fleet["etcd_error"].is_null());

  ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
  const json after = WaitNewPrimary(cluster, first, "the pair after the kill");
  record_primary(PrimaryId(after));
  cluster.CheckFencing();
}

}  // namespace
}  // namespace baton::chaos
