// The Grafana dashboard (deploy/grafana/baton.json) against what Baton exports: every query is
// valid PromQL (promtool check rules, over a rule file of them all), evaluates on a real
// Prometheus, and names only metrics that a live stack exports or that the recording rules
// make. The stack is a fleet node (a controller registered in a real etcd, with a
// reference-engine pair), a router that follows its controller and one that follows the fleet,
// all scraped by Prometheus with the recording rules loaded, after a controller restart and a
// failover under requests. The alert and recording rules are held to the same set of names
// (CUDA-only metrics aside, which a host without a GPU cannot export). The test prints every query
// and the metrics it names.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_load.h"
#include "tests/chaos/router_stream_support.h"
#include "tests/deploy/deploy_support.h"

namespace baton::deploy_test {
namespace {

using chaos::ChaosCluster;
using chaos::ClusterOptions;
using chaos::RouterProcess;
using fleet_test::EtcdCluster;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Metrics only the CUDA backend exports (the controller on a GPU host).
const std::set<std::string> kCudaOnly = {"baton_device_lost", "baton_device_losses_total",
                                         "baton_device_rebuilds_total"};

struct Query {
  std::string panel;
  std::string expr;
};

// Every target expression of the dashboard, its Grafana variables given values.
std::vector<Query> DashboardQueries(const json& dashboard) {
  std::vector<Query> out;
  for (const json& panel : dashboard["panels"]) {
    if (!panel.contains("targets")) continue;
    for (const json& target : panel["targets"]) {
      std::string expr = target["expr"].get<std::string>();
      expr = ReplaceAll(expr, "$__rate_interval", "1m");
      expr = ReplaceAll(expr, "$instance", ".*");
      out.push_back({panel["title"].get<std::string>(), expr});
    }
  }
  return out;
}

// Every rule expression of a rules file.
std::vector<Query> RuleQueries(const std::string& path) {
  std::vector<Query> out;
  std::ifstream in(path);
  std::string line, name;
  // The files are ours: "- alert: X" or "- record: X", then "expr: ..." on one line or a
  // block ("expr: |" and the lines indented below it).
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    if (std::regex_search(lines[i], m, std::regex(R"(- (alert|record): (\S+))"))) name = m[2];
    if (!std::regex_search(lines[i], m, std::regex(R"(^(\s*)expr: (.*)$)"))) continue;
    std::string expr = m[2];
    if (expr == "|") {
      expr.clear();
      const size_t indent = m[1].length();
      while (i + 1 < lines.size() && lines[i + 1].size() > indent + 2 &&
             lines[i + 1].compare(0, indent + 2, std::string(indent + 2, ' ')) == 0) {
        expr += lines[++i] + "\n";
      }
    }
    out.push_back({name, expr});
  }
  return out;
}

TEST(Dashboard, EveryQueryIsValidPromqlAndNamesOnlyMetricsBatonExports) {
  ASSERT_EQ(::access(kPrometheusBinary, X_OK), 0) << "scripts/install-deps installs prometheus";
  ASSERT_EQ(::access(kPromtoolBinary, X_OK), 0) << "scripts/install-deps installs prometheus";
  ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
  const json dashboard =
      json::parse(ReadFile(SourceDir() + "/deploy/grafana/baton.json"), nullptr, false);
  ASSERT_TRUE(dashboard.is_object()) << "deploy/grafana/baton.json is not JSON";
  const std::vector<Query> queries = DashboardQueries(dashboard);
  ASSERT_FALSE(queries.empty());

  // 1. promtool: one recording rule per query.
  std::string rules = "groups:\n  - name: dashboard\n    rules:\n";
  for (size_t i = 0; i < queries.size(); ++i) {
    rules += "      - record: dashboard:query_" + std::to_string(i) +
             "\n        expr: " + json(queries[i].expr).dump() + "\n";
  }
  char tmpl[] = "/tmp/baton-dashboard-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) != nullptr ? tmpl : "/tmp";
  WriteFile(dir + "/dashboard-queries.yml", rules);
  const ProgramRun check =
      RunProgram({kPromtoolBinary, "check", "rules", dir + "/dashboard-queries.yml"});
  EXPECT_EQ(check.code, 0) << check.output;
  EXPECT_NE(check.output.find("SUCCESS: " + std::to_string(queries.size()) + " rules found"),
            std::string::npos)
      << check.output;
  std::filesystem::remove_all(dir);

  // 2. A live fleet node, its routers, a failover and requests, scraped by Prometheus.
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.WaitHealthy()) << "etcd did not come up:\n" << etcd.LogTails();
  ClusterOptions o = chaos::RefenginePair();
  o.metrics_port = chaos::FreePort();
  o.extra_toml = "[fleet]\netcd = \"" + etcd.endpoints()[0] +
                 "\"\nprefix = \"/baton-dash/\"\nnode = \"node-a\"\nmodel = \"" +
                 chaos::kRouterTestModel + "\"\nlease_ttl_ms = 2000\n";
  ChaosCluster cluster(o);
  cluster.KillController();  // a restart, which re-adopts the pair
  cluster.RestartController();
  RouterProcess router(cluster.socket(), cluster.dir());
  RouterProcess fleet_router({"--etcd", etcd.endpoints()[0], "--etcd-prefix", "/baton-dash/"},
                             cluster.dir(), "fleet-router.log");
  ASSERT_TRUE(router.ready() && fleet_router.ready()) << router.Log() << fleet_router.Log();
  std::vector<json> requests;
  std::vector<chaos::StreamOutput> want;
  chaos::References(router.port(), "dashboard", 6, &requests, &want);
  const chaos::LoadResult load = chaos::LoadAround(
      std::vector<uint16_t>{router.port(), fleet_router.port()}, requests, want, [&] {
        ASSERT_EQ(cluster.Ctl({"drill", "kill"}).exit_code, 0);
      });
  EXPECT_TRUE(load.failures.empty()) << json(load.failures).dump(1);
  const json status = cluster.WaitReady("a standby after the drill");
  std::vector<std::string> engines;
  for (const json& e : status["engines"]) engines.push_back(e["http_address"].get<std::string>());
  PrometheusServer prometheus(
      ScrapeConfig(500, {"127.0.0.1:" + std::to_string(o.metrics_port)},
                   {"127.0.0.1:" + std::to_string(router.port()),
                    "127.0.0.1:" + std::to_string(fleet_router.port())},
                   engines, {"baton-rules.yml"}),
      std::vector<std::pair<std::string, std::string>>{
          {"baton-rules.yml", ReadFile(SourceDir() + "/deploy/prometheus/baton-rules.yml")}});
  ASSERT_TRUE(prometheus.ready()) << prometheus.Log();

  // Everything Baton exports here, once every process was scraped and the rules evaluated.
  std::set<std::string> exported;
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    exported.clear();
    const json names = prometheus.Api("label/__name__/values");
    if (names.is_array()) {
      for (const json& n : names) exported.insert(n.get<std::string>());
    }
    if (exported.count("baton_last_failover_phase_ms") &&
        exported.count("baton_fleet_registered") && exported.count("baton_router_fleet_node_up") &&
        exported.count("baton_engine_serving") &&
        exported.count("baton:router_shed_ratio:rate5m") &&
        exported.count("baton_controller_readopt_ms")) {
      break;
    }
    std::this_thread::sleep_for(milliseconds(250));
  }
  std::printf("exported here: %zu metric names\n", exported.size());

  // 3. Each query evaluates, and names only exported metrics.
  std::set<std::string> all_named;
  for (const Query& q : queries) {
    std::string error;
    const json result = prometheus.Query(q.expr, &error);
    EXPECT_TRUE(result.is_object()) << q.panel << ": " << q.expr << ": " << error;
    const std::set<std::string> names = MetricNames(q.expr);
    EXPECT_FALSE(names.empty()) << q.panel << ": " << q.expr << " names no metric";
    std::string listed;
    for (const std::string& n : names) {
      listed += (listed.empty() ? "" : ", ") + n;
      all_named.insert(n);
      EXPECT_TRUE(exported.count(n) != 0)
          << q.panel << ": " << q.expr << " names " << n << ", which Baton does not export";
    }
    std::printf("query  [%s] %s\n       metrics: %s\n", q.panel.c_str(), q.expr.c_str(),
                listed.c_str());
  }
  std::printf("%zu queries checked, naming %zu metrics\n", queries.size(), all_named.size());

  // 4. The rules name only exported metrics too (and Prometheus' own `up`).
  for (const char* file : {"baton-alerts.yml", "baton-rules.yml"}) {
    for (const Query& rule : RuleQueries(SourceDir() + "/deploy/prometheus/" + std::string(file))) {
      for (const std::string& n : MetricNames(rule.expr)) {
        const bool known = exported.count(n) != 0 || kCudaOnly.count(n) != 0 || n == "up";
        EXPECT_TRUE(known) << file << " " << rule.panel << " names " << n
                           << ", which Baton does not export";
      }
    }
  }
}

}  // namespace
}  // namespace baton::deploy_test
