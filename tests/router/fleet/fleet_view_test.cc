// FleetView's reports against a real etcd (tests/fleet/etcd_cluster.h): one key per node this
// router saw, and a node's key deleted once nothing of it is left to report (its engines were
// all forgotten, router/canary/engine_outcomes.h), so that neither etcd nor the view keeps a
// key for every node ever seen; a report past max_report_bytes is not written, and the others
// are, with etcd still seen as answering.
#include "router/fleet/fleet_view.h"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>

#include "tests/fleet/etcd_cluster.h"
#include "tests/router/wait_for.h"

namespace baton {
namespace {

using fleet_test::EtcdCluster;
using std::chrono::milliseconds;

TEST(FleetViewTest, ANodeNoLongerReportedHasItsReportDeletedAndAnOversizeOneIsNotWritten) {
  ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.WaitHealthy()) << "etcd did not come up:\n" << cluster.LogTails();
  Result<std::unique_ptr<EtcdClient>> reader =
      EtcdClient::Create({.endpoints = cluster.endpoints(), .timeout = milliseconds(1000)});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  FleetViewOptions options;
  options.etcd.endpoints = cluster.endpoints();
  options.etcd.timeout = milliseconds(1000);
  options.prefix = "/t/";
  options.poll = milliseconds(20);
  options.report_every = milliseconds(20);
  options.router = "r1";
  options.max_report_bytes = 400;  // one engine's outcome fits, twenty do not
  Result<std::unique_ptr<FleetView>> view = FleetView::Create(options);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  auto mu = std::make_shared<std::mutex>();
  auto reports = std::make_shared<FleetView::Reports>();
  (*reports)["a"] = {{.engine_id = 1, .requests = 3}};
  (*reports)["b"] = {{.engine_id = 4, .requests = 5}};
  (*view)->OnReport([mu, reports] {
    std::lock_guard<std::mutex> lock(*mu);
    return *reports;
  });
  (*view)->Start();
  const auto keys = [&] {
    Result<EtcdRange> range = (*reader)->GetPrefix("/t/reports/");
    std::vector<std::string> out;
    if (range.ok()) {
      for (const EtcdKeyValue& kv : range->kvs) out.push_back(kv.key);
    }
    return out;
  };
  const std::vector<std::string> both = {FleetReportKey("/t/", "a", "r1"),
                                         FleetReportKey("/t/", "b", "r1")};
  EXPECT_TRUE(WaitFor([&] { return keys() == both; }));
  {
    std::lock_guard<std::mutex> lock(*mu);
    reports->erase("a");  // node a's engines were all forgotten
  }
  EXPECT_TRUE(WaitFor([&] { return keys() == std::vector<std::string>{both[1]}; }));
  const std::vector<std::string> b_and_c = {both[1], FleetReportKey("/t/", "c", "r1")};
  {
    std::lock_guard<std::mutex> lock(*mu);
    for (uint64_t id = 1; id <= 20; ++id) (*reports)["c"].push_back({.engine_id = id});
    (*reports)["b"][0].requests = 6;  // b changes: written while c is refused
  }
  EXPECT_TRUE(WaitFor([&] {
    Result<EtcdRange> b = (*reader)->GetPrefix(both[1]);
    return b.ok() && b->kvs.size() == 1 &&
           b->kvs[0].value.find("\"requests\":6") != std::string::npos;
  }));
  EXPECT_EQ(keys(), std::vector<std::string>{both[1]}) << "c's report is too large";
  EXPECT_TRUE((*view)->state().etcd_connected);
  EXPECT_EQ((*view)->state().failures, 0u);
  {
    std::lock_guard<std::mutex> lock(*mu);
    (*reports)["c"].resize(1);  // pruned: it fits
  }
  EXPECT_TRUE(WaitFor([&] { return keys() == b_and_c; }));
  (*view)->Stop();
}

}  // namespace
}  // namespace baton
