// The alert rules (deploy/prometheus/baton-alerts.yml) on a real Prometheus (Debian's
// /usr/bin/prometheus on its own loopback address and data folder) scraping a live stack: a
// controller with a reference-engine pair, the engines and a router. The real rules are loaded
// with their `for:` shortened to 2 s and scraped and evaluated every 500 ms, so that a test
// takes seconds (tests/deploy/prometheus/baton-alerts.test.yml pins the real durations).
//
// A `batonctl drill kill` and then a stopped standby (SIGSTOP: the controller finds it hung and
// kills it), each while new standbys are held back at a gate, make BatonPairWithoutStandby go
// pending, then firing; opening the gate lets a standby register and the alert resolves. Every
// state is read through Prometheus' HTTP API. Prometheus also shows every rule evaluating
// without error and the failover in the router's and the engines' own metrics.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <regex>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_stream_support.h"
#include "tests/deploy/deploy_support.h"

namespace baton::deploy_test {
namespace {

using chaos::ChaosCluster;
using chaos::ClusterOptions;
using chaos::RouterProcess;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kIntervalMs = 500;

// A base port with it and the next three free on 127.0.0.1 (outside the ephemeral range).
int FreeBasePort() {
  std::mt19937 pick(std::random_device{}());
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int base = 20000 + static_cast<int>(pick() % 9000);
    bool free = true;
    for (int k = 0; k < 4 && free; ++k) {
      UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(base + k));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      free = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    }
    if (free) return base;
  }
  return 0;
}

// The real alert rules with every `for:` at 2 s.
std::string ShortenedAlerts() {
  const std::string rules = ReadFile(SourceDir() + "/deploy/prometheus/baton-alerts.yml");
  return std::regex_replace(rules, std::regex(R"(for: \S+)"), "for: 2s");
}

class PrometheusStack : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(kPrometheusBinary, X_OK), 0)
        << kPrometheusBinary << " is missing: scripts/install-deps installs Debian's prometheus";
    ClusterOptions o = chaos::RefenginePair();
    base_port_ = FreeBasePort();
    ASSERT_NE(base_port_, 0);
    o.base_port = base_port_;
    o.metrics_port = chaos::FreePort();
    o.register_timeout_ms = 60'000;  // an engine held at the gate is not a failure
    gate_.Open();                    // closed only while a test holds the next standby back
    o.engine_wrapper = {"/bin/sh", "-c", gate_.ShellWait() + "exec \"$@\"", "gated-engine"};
    cluster_ = std::make_unique<ChaosCluster>(o);
    router_ = std::make_unique<RouterProcess>(cluster_->socket(), cluster_->dir());
    ASSERT_TRUE(router_->ready()) << router_->Log();
    std::vector<std::string> engines;
    for (int k = 0; k < 4; ++k) engines.push_back("127.0.0.1:" + std::to_string(base_port_ + k));
    prometheus_ = std::make_unique<PrometheusServer>(
        ScrapeConfig(kIntervalMs, {"127.0.0.1:" + std::to_string(o.metrics_port)},
                     {"127.0.0.1:" + std::to_string(router_->port())}, engines,
                     {"baton-alerts.yml", "baton-rules.yml"}),
        std::vector<std::pair<std::string, std::string>>{
            {"baton-alerts.yml", ShortenedAlerts()},
            {"baton-rules.yml", ReadFile(SourceDir() + "/deploy/prometheus/baton-rules.yml")}});
    ASSERT_TRUE(prometheus_->ready()) << prometheus_->Log();
  }

  void TearDown() override {
    gate_.Open();
    prometheus_.reset();
    router_.reset();
    cluster_.reset();
  }

  void CloseGate() { gate_.Close(); }
  void OpenGate() { gate_.Open(); }

  // The value of a one-sample instant query, or NaN.
  double Value(const std::string& promql) const {
    const json data = prometheus_->Query(promql);
    if (!data.is_object() || data["result"].size() != 1) return std::nan("");
    return std::stod(data["result"][0]["value"][1].get<std::string>());
  }

  // Polls until `promql` has one sample equal to `want`; records a failure after 30 s.
  void WaitValue(const std::string& promql, double want) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(30);
    double got = std::nan("");
    while (std::chrono::steady_clock::now() < deadline) {
      got = Value(promql);
      if (got == want) return;
      std::this_thread::sleep_for(milliseconds(100));
    }
    ADD_FAILURE() << promql << " is " << got << ", not " << want << "\n" << prometheus_->Log();
  }

  // Polls alert `name` until it reaches `want` ("pending", "firing", or "" once resolved);
  // returns every state it went through on the way (each change once).
  std::vector<std::string> WaitAlert(const std::string& name, const std::string& want) {
    std::vector<std::string> seen;
    const auto deadline = std::chrono::steady_clock::now() + seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string state = prometheus_->AlertState(name);
      if (seen.empty() || seen.back() != state) seen.push_back(state);
      if (state == want) return seen;
      std::this_thread::sleep_for(milliseconds(100));
    }
    ADD_FAILURE() << name << " never became \"" << want << "\"; states seen: " << json(seen).dump()
                  << "\n"
                  << prometheus_->Log();
    return seen;
  }

  // BatonPairWithoutStandby goes pending, then firing, while the gate holds the new standby;
  // once the gate opens and a standby registers, it resolves.
  void ExpectWithoutStandbyCycle(const std::string& fault) {
    SCOPED_TRACE(fault);
    const std::vector<std::string> to_firing = WaitAlert("BatonPairWithoutStandby", "firing");
    EXPECT_NE(std::find(to_firing.begin(), to_firing.end(), "pending"), to_firing.end())
        << "firing without a pending state first: " << json(to_firing).dump();
    std::printf("%s: BatonPairWithoutStandby %s\n", fault.c_str(), json(to_firing).dump().c_str());
    EXPECT_FALSE(chaos::IsReady(cluster_->Status())) << "a standby came past the gate";
    OpenGate();
    cluster_->WaitReady("a standby past the gate");
    const std::vector<std::string> resolved = WaitAlert("BatonPairWithoutStandby", "");
    std::printf("%s: then %s (resolved)\n", fault.c_str(), json(resolved).dump().c_str());
  }

  chaos::GateFile gate_{"prometheus"};
  int base_port_ = 0;
  std::unique_ptr<ChaosCluster> cluster_;
  std::unique_ptr<RouterProcess> router_;
  std::unique_ptr<PrometheusServer> prometheus_;
};

TEST_F(PrometheusStack, DrillKillAndStoppedStandbyFireAndResolveBatonPairWithoutStandby) {
  // Prometheus scrapes the controller, the router and both engines, and every rule evaluates.
  WaitValue("up{job=\"baton-controller\"}", 1);
  WaitValue("up{job=\"baton-router\"}", 1);
  WaitValue("count(up{job=\"baton-engine\"} == 1)", 2);
  WaitValue("baton_pair_ready", 1);
  WaitValue("sum(baton_engine_serving)", 1);
  WaitValue("baton_router_has_primary", 1);
  EXPECT_EQ(prometheus_->AlertState("BatonPairWithoutStandby"), "");
  const json rules = prometheus_->Api("rules");
  ASSERT_TRUE(rules.is_object());
  int evaluated = 0;
  for (const json& group : rules["groups"]) {
    for (const json& rule : group["rules"]) {
      EXPECT_EQ(rule.value("health", ""), "ok")
          << rule.value("name", "") << ": " << rule.value("lastError", "");
      ++evaluated;
    }
  }
  EXPECT_GE(evaluated, 30) << rules.dump();

  // 1. kill -9 of the primary: the standby takes over, the next standby waits at the gate.
  const uint64_t failovers_before = static_cast<uint64_t>(Value("baton_router_failovers_total"));
  CloseGate();
  ASSERT_EQ(cluster_->Ctl({"drill", "kill"}).exit_code, 0);
  ExpectWithoutStandbyCycle("drill kill");
  WaitValue("baton_router_failovers_total", static_cast<double>(failovers_before + 1));
  WaitValue("sum(baton_engine_serving)", 1);

  // 2. the standby stopped (SIGSTOP): found hung, killed; its successor waits at the gate.
  const json before = cluster_->WaitReady();
  const pid_t standby = chaos::PidOf(chaos::EngineWithRole(before, "standby"));
  ASSERT_GT(standby, 0);
  CloseGate();
  ASSERT_EQ(::kill(standby, SIGSTOP), 0);
  ExpectWithoutStandbyCycle("stopped standby");
  WaitValue("baton_pair_ready", 1);
}

}  // namespace
}  // namespace baton::deploy_test
