// FleetReportReader against a real etcd (tests/fleet/etcd_cluster.h): each report of its node
// that changed is delivered once per version, with the stalls it carries (each named by the
// report's router), a report without stalls with none, and another node's reports not at
// all; a report that does not parse is skipped and the others are delivered; the stalls of a
// key first seen (perhaps a dead router's last report) are not, and stalls that do not parse
// cost their report nothing; keys gone from etcd are forgotten.
#include "controller/fleet_reports.h"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "fleet/fleet_records.h"
#include "tests/fleet/etcd_cluster.h"
#include "tests/router/wait_for.h"

namespace baton {
namespace {

using fleet_test::EtcdCluster;
using std::chrono::milliseconds;

struct Delivered {
  proto::RouterReport report;
  std::vector<proto::EngineStalled> stalls;
};

TEST(FleetReportReaderTest, DeliversEachNewReportOfItsNodeWithItsStalls) {
  ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.WaitHealthy()) << "etcd did not come up:\n" << cluster.LogTails();
  const EtcdOptions options{.endpoints = cluster.endpoints(), .timeout = milliseconds(5000)};
  Result<std::unique_ptr<EtcdClient>> writer = EtcdClient::Create(options);
  Result<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Create(options);
  ASSERT_TRUE(writer.ok() && etcd.ok());
  auto mu = std::make_shared<std::mutex>();
  auto got = std::make_shared<std::vector<Delivered>>();
  FleetReportReader reader(
      std::move(*etcd), FleetReportsPrefix("/t/", "a"),
      [mu, got](proto::RouterReport r, std::vector<proto::EngineStalled> s) {
        std::lock_guard<std::mutex> lock(*mu);
        got->push_back({std::move(r), std::move(s)});
      },
      milliseconds(20));
  const auto delivered = [&] {
    std::lock_guard<std::mutex> lock(*mu);
    return *got;
  };
  const proto::RouterReport r1{
      .seq = 1, .engines = {{.engine_id = 2, .requests = 4}}, .router = "r1"};
  ASSERT_TRUE((*writer)->Put(FleetReportKey("/t/", "a", "r1"), RouterReportJson(r1)).ok());
  ASSERT_TRUE((*writer)->Put(FleetReportKey("/t/", "b", "r1"), RouterReportJson(r1)).ok());
  ASSERT_TRUE((*writer)->Put(FleetReportKey("/t/", "a", "bad"), "{not json").ok());
  ASSERT_TRUE(WaitFor([&] { return delivered().size() == 1; }));
  EXPECT_EQ(delivered()[0].report.engines, r1.engines);
  EXPECT_TRUE(delivered()[0].stalls.empty());
  proto::RouterReport r2 = r1;
  r2.seq = 2;
  const std::vector<proto::EngineStalled> stalls = {
      {.engine_id = 2, .streams = 3, .quiet_ms = 1250}};
  ASSERT_TRUE((*writer)->Put(FleetReportKey("/t/", "a", "r1"), RouterReportJson(r2, stalls)).ok());
  ASSERT_TRUE(WaitFor([&] { return delivered().size() == 2; }));
  const Delivered d = delivered()[1];
  EXPECT_EQ(d.report.seq, 2u);
  ASSERT_EQ(d.stalls.size(), 1u);
  EXPECT_EQ(d.stalls[0].engine_id, 2u);
  EXPECT_EQ(d.stalls[0].streams, 3u);
  EXPECT_EQ(d.stalls[0].quiet_ms, 1250u);
  EXPECT_EQ(d.stalls[0].router, "r1");
  // A router first seen with a stall: its outcomes are taken, its stalls from its next
  // version on (a live router writes a stall's again within a report interval).
  proto::RouterReport r3{.seq = 1, .engines = {{.engine_id = 2, .requests = 1}}, .router = "r3"};
  const std::string r3_key = FleetReportKey("/t/", "a", "r3");
  ASSERT_TRUE((*writer)->Put(r3_key, RouterReportJson(r3, stalls)).ok());
  ASSERT_TRUE(WaitFor([&] { return delivered().size() == 3; }));
  EXPECT_EQ(delivered()[2].report.router, "r3");
  EXPECT_TRUE(delivered()[2].stalls.empty()) << "a first-seen key's stalls";
  // Stalls this reader cannot read cost their report nothing.
  nlohmann::json odd = nlohmann::json::parse(RouterReportJson(r3));
  odd["seq"] = 2;
  odd["stalls"] = "many";
  ASSERT_TRUE((*writer)->Put(r3_key, odd.dump()).ok());
  ASSERT_TRUE(WaitFor([&] { return delivered().size() == 4; }));
  EXPECT_EQ(delivered()[3].report.seq, 2u);
  EXPECT_EQ(delivered()[3].report.engines, r3.engines);
  EXPECT_TRUE(delivered()[3].stalls.empty());
  r3.seq = 3;
  ASSERT_TRUE((*writer)->Put(r3_key, RouterReportJson(r3, stalls)).ok());
  ASSERT_TRUE(WaitFor([&] { return delivered().size() == 5; }));
  ASSERT_EQ(delivered()[4].stalls.size(), 1u);
  EXPECT_EQ(delivered()[4].stalls[0].router, "r3");
  std::this_thread::sleep_for(milliseconds(200));  // ten reads more: the same version again
  EXPECT_EQ(delivered().size(), 5u) << "a version is delivered once";
  EXPECT_EQ(reader.delivered(), 5u);
  EXPECT_EQ(reader.tracked(), 3u);  // r1, r3 and the one that does not parse
  // The routers' keys gone (their leases ended): the reader forgets them.
  ASSERT_TRUE((*writer)->DeletePrefix(FleetReportsPrefix("/t/", "a")).ok());
  EXPECT_TRUE(WaitFor([&] { return reader.tracked() == 0; }));
}

}  // namespace
}  // namespace baton
