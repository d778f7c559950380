#include "controller/ctl/degradations.h"

#include <gtest/gtest.h>

#include <string>

namespace baton {
namespace {

// A controller that got everything its configuration asked for.
ControllerStatus Healthy(const ControllerConfig& config) {
  ControllerStatus s;
  s.config = &config;
  s.weights.huge_pages = true;
  s.weights.locked = true;
  s.pool.huge_pages = true;
  s.keeper.state = KeeperState::kKeeping;
  return s;
}

bool Has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(Degradations, NoneWhenEverythingAskedForIsThere) {
  ControllerConfig config;
  config.fleet_etcd = {"http://127.0.0.1:2379", "localhost:2379"};  // on this host: not exposed
  const ControllerStatus s = Healthy(config);
  EXPECT_TRUE(Degradations(s).empty());
  EXPECT_EQ(DegradationText(s), "");
  EXPECT_EQ(DegradationJson(s), nlohmann::json::array());
  const std::string m = DegradationMetrics(s);
  for (const std::string& kind : DegradationKinds()) {
    EXPECT_TRUE(Has(m, "baton_degraded{what=\"" + kind + "\"} 0\n")) << m;
  }
  EXPECT_TRUE(Has(m, "baton_memory_kept 1\n")) << m;
}

TEST(Degradations, APartialArenaIsDegradedWithItsSplit) {
  ControllerConfig config;
  ControllerStatus s = Healthy(config);
  s.weights.huge_bytes = 4u << 20;
  s.weights.small_bytes = 8192;
  s.weights.warnings = {"mbind refused",
                        "partial huge pages: 4194304 bytes on 2 MiB pages, "
                        "8192 bytes on 4 KiB pages (why)"};
  const std::string text = DegradationText(s);
  EXPECT_TRUE(Has(text, "degraded: weights_huge_pages: partial huge pages: 4194304 bytes")) << text;
  EXPECT_TRUE(Has(DegradationMetrics(s), "baton_degraded{what=\"weights_huge_pages\"} 1\n"));
}

TEST(Degradations, EachFallbackIsAMetricALineAndAJsonEntry) {
  ControllerConfig config;
  config.fleet_etcd = {"http://127.0.0.1:2379", "http://10.0.0.2:2379"};
  config.engine_host = "10.0.0.17";
  ControllerStatus s = Healthy(config);
  s.weights.huge_pages = false;
  s.weights.warnings = {"2018 free 2 MiB huge pages of the 2019 the arena needs"};
  s.weights.locked = false;
  s.pool.huge_pages = false;
  s.pool.huge_pages_fallback = "no free huge pages for the pool";
  s.keeper = {.state = KeeperState::kUnavailable,
              .pid = 0,
              .restarts = 0,
              .detail = "no executable baton-keeper beside /x/baton-controller"};
  s.weights.files_differ = "the model files changed (m changed) and do not load (bad)";
  const std::string m = DegradationMetrics(s);
  for (const std::string& kind : DegradationKinds()) {
    EXPECT_TRUE(Has(m, "baton_degraded{what=\"" + kind + "\"} 1\n")) << m;
  }
  const std::string text = DegradationText(s);
  EXPECT_TRUE(Has(text, "degraded: weights_huge_pages: 2018 free 2 MiB huge pages")) << text;
  EXPECT_TRUE(Has(text, "degraded: weights_mlock: ")) << text;
  EXPECT_TRUE(Has(text, "degraded: pool_huge_pages: no free huge pages for the pool")) << text;
  EXPECT_TRUE(Has(text, "degraded: keeper: baton-keeper unavailable (no executable")) << text;
  EXPECT_TRUE(Has(text, "degraded: weights_files: the model files changed (m changed)")) << text;
  EXPECT_TRUE(Has(text,
                  "degraded: etcd_plaintext: etcd http://10.0.0.2:2379 is reached in plain "
                  "HTTP off this host"))
      << text;
  EXPECT_TRUE(Has(text,
                  "degraded: engines_open: engines listen on 10.0.0.17 with no [engine] "
                  "key_file: whoever reaches their ports is served without a router"))
      << text;
  EXPECT_EQ(DegradationJson(s).size(), 7u);

  // A keeper that died and is being started again keeps nothing meanwhile.
  const ControllerConfig no_fleet;
  ControllerStatus restarting = Healthy(no_fleet);
  restarting.keeper = {.state = KeeperState::kRestarting, .pid = 0, .restarts = 1, .detail = ""};
  ASSERT_EQ(Degradations(restarting).size(), 1u);
  EXPECT_EQ(Degradations(restarting)[0].what, "keeper");
  EXPECT_TRUE(Has(DegradationMetrics(restarting), "baton_memory_kept 0\n"));
}

// etcd over TLS, wherever it is, is not a degradation.
TEST(Degradations, EtcdOverTlsIsNot) {
  ControllerConfig config;
  config.fleet_etcd = {"https://10.0.0.1:2379", "10.0.0.2:2379"};
  config.fleet_etcd_ca_file = "/etc/baton/etcd-ca.pem";
  EXPECT_TRUE(Degradations(Healthy(config)).empty());
}

// Engines on the loopback, or given a key, are not open to the network.
TEST(Degradations, EnginesOnTheLoopbackOrWithAKeyAreNotOpen) {
  ControllerConfig config;
  for (const char* host : {"127.0.0.1", "127.3.4.5", "localhost", "::1"}) {
    config.engine_host = host;
    EXPECT_TRUE(Degradations(Healthy(config)).empty()) << host;
  }
  config.engine_host = "10.0.0.17";
  config.engine_key_file = "/etc/baton/engine.key";
  EXPECT_TRUE(Degradations(Healthy(config)).empty());
  config.engine_host = "0.0.0.0";
  config.engine_key_file.clear();
  ASSERT_EQ(Degradations(Healthy(config)).size(), 1u);
  EXPECT_EQ(Degradations(Healthy(config))[0].what, "engines_open");
}

// What the operator turned off is not a degradation; neither is an adopted arena whose mlock
// still runs in the background.
TEST(Degradations, SettingsTurnedOffAndAPendingLockAreNot) {
  ControllerConfig config;
  config.weights_huge_pages = false;
  config.pool_huge_pages = false;
  config.keep_memory = false;
  ControllerStatus s = Healthy(config);
  s.weights.huge_pages = false;
  s.pool.huge_pages = false;
  s.keeper = {.state = KeeperState::kOff,
              .pid = 0,
              .restarts = 0,
              .detail = "controller.keep_memory = false"};
  s.weights.locked = false;
  s.weights.lock_pending = true;
  EXPECT_TRUE(Degradations(s).empty()) << DegradationText(s);
  s.weights.lock_pending = false;
  ASSERT_EQ(Degradations(s).size(), 1u);
  EXPECT_EQ(Degradations(s)[0].what, "weights_mlock");
}

}  // namespace
}  // namespace baton
