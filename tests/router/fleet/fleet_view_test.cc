// FleetView's reports against a real etcd (tests/fleet/etcd_cluster.h): one key per node this
// router saw, and a node's key deleted once nothing of it is left to report (its engines were
// all forgotten, router/canary/engine_outcomes.h), so that neither etcd nor the view keeps a
// key for every node ever seen; a report past max_report_bytes is not written, and the others
// are, with etcd still seen as answering. A node's stalls are written with its report, read
// back as its controller reads them (ParseRouterReport), rewritten while they last, and left
// out once they end. A report etcd refuses (its access control denies the key) is counted and
// the other nodes' reports are written, etcd still seen as answering.
#include "router/fleet/fleet_view.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>

#include "base/text/base64.h"
#include "tests/fleet/etcd_cluster.h"
#include "tests/fleet/fake_etcd_member.h"
#include "tests/router/wait_for.h"

namespace baton {
namespace {

using fleet_test::EtcdCluster;
using std::chrono::milliseconds;

// Router r1's view of `cluster` under /t/, reading and reporting every 20 ms.
FleetViewOptions FastOptions(const EtcdCluster& cluster) {
  FleetViewOptions options;
  options.etcd.endpoints = cluster.endpoints();
  options.etcd.timeout = milliseconds(5000);
  options.prefix = "/t/";
  options.poll = milliseconds(20);
  options.report_every = milliseconds(20);
  options.router = "r1";
  return options;
}

// The report keys under /t/reports/ now (none when etcd does not answer).
std::vector<std::string> ReportKeys(EtcdClient& reader) {
  Result<EtcdRange> range = reader.GetPrefix("/t/reports/");
  std::vector<std::string> out;
  if (range.ok()) {
    for (const EtcdKeyValue& kv : range->kvs) out.push_back(kv.key);
  }
  return out;
}

TEST(FleetViewTest, ANodeNoLongerReportedHasItsReportDeletedAndAnOversizeOneIsNotWritten) {
  ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.WaitHealthy()) << "etcd did not come up:\n" << cluster.LogTails();
  Result<std::unique_ptr<EtcdClient>> reader =
      EtcdClient::Create({.endpoints = cluster.endpoints(), .timeout = milliseconds(5000)});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  FleetViewOptions options = FastOptions(cluster);
  options.max_report_bytes = 400;  // one engine's outcome fits, twenty do not
  Result<std::unique_ptr<FleetView>> view = FleetView::Create(options);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  auto mu = std::make_shared<std::mutex>();
  auto reports = std::make_shared<FleetView::Reports>();
  (*reports)["a"].engines = {{.engine_id = 1, .requests = 3}};
  (*reports)["b"].engines = {{.engine_id = 4, .requests = 5}};
  (*view)->OnReport([mu, reports] {
    std::lock_guard<std::mutex> lock(*mu);
    return *reports;
  });
  (*view)->Start();
  const auto keys = [&] { return ReportKeys(**reader); };
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
    for (uint64_t id = 1; id <= 20; ++id) (*reports)["c"].engines.push_back({.engine_id = id});
    (*reports)["b"].engines[0].requests = 6;  // b changes: written while c is refused
  }
  EXPECT_TRUE(WaitFor([&] {
    Result<EtcdRange> b = (*reader)->GetPrefix(both[1]);
    return b.ok() && b->kvs.size() == 1 &&
           b->kvs[0].value.find("\"requests\":6") != std::string::npos;
  }));
  EXPECT_EQ(keys(), std::vector<std::string>{both[1]}) << "c's report is too large";
  EXPECT_TRUE((*view)->state().etcd_connected);
  {
    std::lock_guard<std::mutex> lock(*mu);
    (*reports)["c"].engines.resize(1);  // pruned: it fits
  }
  EXPECT_TRUE(WaitFor([&] { return keys() == b_and_c; }));
  (*view)->Stop();
}

TEST(FleetViewTest, ANodesStallsAreWrittenWithItsReportWhileTheyLast) {
  ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.WaitHealthy()) << "etcd did not come up:\n" << cluster.LogTails();
  Result<std::unique_ptr<EtcdClient>> reader =
      EtcdClient::Create({.endpoints = cluster.endpoints(), .timeout = milliseconds(5000)});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  FleetViewOptions options = FastOptions(cluster);
  Result<std::unique_ptr<FleetView>> view = FleetView::Create(options);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  auto mu = std::make_shared<std::mutex>();
  auto reports = std::make_shared<FleetView::Reports>();
  (*reports)["a"].engines = {{.engine_id = 1, .requests = 3}};
  (*reports)["a"].stalls = {{.engine_id = 1, .streams = 2, .quiet_ms = 1000}};
  (*view)->OnReport([mu, reports] {
    std::lock_guard<std::mutex> lock(*mu);
    return *reports;
  });
  (*view)->Start();
  const std::string key = FleetReportKey("/t/", "a", "r1");
  // The stalls of node a's report in etcd; none when there is no report.
  const auto stalls = [&] {
    Result<EtcdRange> range = (*reader)->GetPrefix(key);
    if (!range.ok() || range->kvs.size() != 1) return std::vector<proto::EngineStalled>{};
    Result<std::vector<proto::EngineStalled>> out = ParseReportStalls(key, range->kvs[0].value);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : std::vector<proto::EngineStalled>{};
  };
  EXPECT_TRUE(WaitFor([&] {
    const std::vector<proto::EngineStalled> s = stalls();
    return s.size() == 1 && s[0].engine_id == 1 && s[0].streams == 2 && s[0].quiet_ms == 1000 &&
           s[0].router == "r1";
  }));
  {
    std::lock_guard<std::mutex> lock(*mu);
    (*reports)["a"].stalls[0].quiet_ms = 1250;  // it lasts: its quiet time grows
  }
  EXPECT_TRUE(WaitFor([&] {
    const std::vector<proto::EngineStalled> s = stalls();
    return s.size() == 1 && s[0].quiet_ms == 1250;
  }));
  {
    std::lock_guard<std::mutex> lock(*mu);
    (*reports)["a"].stalls.clear();  // the engine moves again
  }
  EXPECT_TRUE(WaitFor([&] {
    Result<EtcdRange> range = (*reader)->GetPrefix(key);
    return range.ok() && range->kvs.size() == 1 &&
           range->kvs[0].value.find("stalls") == std::string::npos;
  }));
  (*view)->Stop();
}

TEST(FleetViewTest, AReportEtcdRefusesIsCountedAndTheOthersAreWritten) {
  ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
  EtcdCluster cluster(1);
  ASSERT_TRUE(cluster.WaitHealthy()) << "etcd did not come up:\n" << cluster.LogTails();
  const std::string denied = FleetReportKey("/t/", "a", "r1");
  std::atomic<bool> deny{true};
  fleet_test::FakeEtcdMember member(
      cluster.endpoints()[0],
      [&](const std::string& path,
          const nlohmann::json& request) -> std::optional<fleet_test::FakeAnswer> {
        if (path != "/v3/kv/put" || !deny || request.value("key", "") != Base64Encode(denied)) {
          return std::nullopt;
        }
        return fleet_test::FakeAnswer{
            .status = 403, .body = R"({"error":"etcdserver: permission denied","code":7})"};
      });
  ASSERT_TRUE(member.listening());
  FleetViewOptions options = FastOptions(cluster);
  options.etcd.endpoints = {member.endpoint()};
  Result<std::unique_ptr<FleetView>> view = FleetView::Create(options);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  (*view)->OnReport([] {
    FleetView::Reports r;
    r["a"].engines = {{.engine_id = 1, .requests = 3}};
    r["b"].engines = {{.engine_id = 4, .requests = 5}};
    return r;
  });
  (*view)->Start();
  Result<std::unique_ptr<EtcdClient>> reader =
      EtcdClient::Create({.endpoints = cluster.endpoints(), .timeout = milliseconds(5000)});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const auto keys = [&] { return ReportKeys(**reader); };
  const std::string b = FleetReportKey("/t/", "b", "r1");
  EXPECT_TRUE(WaitFor([&] { return keys() == std::vector<std::string>{b}; }))
      << "b's report is written though a's is refused";
  EXPECT_TRUE(WaitFor([&] { return (*view)->state().reports_refused >= 2; }));
  FleetViewState state = (*view)->state();
  EXPECT_TRUE(state.etcd_connected);
  EXPECT_EQ(state.failures, 0u);
  deny = false;  // access granted: written at the next round
  EXPECT_TRUE(WaitFor([&] { return keys() == std::vector<std::string>{denied, b}; }));
  (*view)->Stop();
}

}  // namespace
}  // namespace baton
