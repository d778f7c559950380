// The engine key between the router and its engines (proto/http/engine_key.h): the Router in
// process, in front of a real baton-refengine given two keys, as a controller launches it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "router/router.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/standby/tiny_engine.h"

namespace baton {
namespace {

using Json = nlohmann::json;

constexpr char kKey[] = "router-engine-key-0123456789";
constexpr char kNextKey[] = "router-next-key-0123456789";
constexpr char kStranger[] = "not-this-engines-key-0123";

const Json kRequest = {{"model", "tiny"}, {"prompt", "keyed"}, {"max_tokens", 4}, {"seed", 3}};

class RouterEngineKeyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ScopedEnvVariable keys("BATON_ENGINE_KEYS", std::string(kKey) + "," + kNextKey);
    engine_ = new TinyEngine("baton-router-key");
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(engine_->port(), 0);
    key_file_ = ::testing::TempDir() + "baton-router-engine-" + std::to_string(::getpid()) + ".key";
  }
  void TearDown() override { std::filesystem::remove(key_file_); }

  void WriteKeys(const std::string& text) {
    std::ofstream(key_file_, std::ios::trunc) << text;
    ::chmod(key_file_.c_str(), 0600);
  }

  std::unique_ptr<Router> StartRouter(bool with_key_file) {
    RouterOptions options;
    options.listen_port = 0;
    options.backend = "127.0.0.1:" + std::to_string(engine_->port());
    options.max_queue_wait = std::chrono::milliseconds(1500);
    if (with_key_file) options.engine_key_file = key_file_;
    auto router = std::make_unique<Router>(std::move(options));
    const Status st = router->Start();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return router;
  }

  static HttpReply Complete(const Router& router, bool stream = false) {
    Json body = kRequest;
    body["stream"] = stream;
    TestHttpClient client(router.port());
    return client.Post("/v1/completions", body.dump());
  }

  static std::string Metrics(const Router& router) {
    TestHttpClient client(router.port());
    return client.Get("/metrics").body;
  }

  static TinyEngine* engine_;
  std::string key_file_;
};

TinyEngine* RouterEngineKeyTest::engine_ = nullptr;

TEST_F(RouterEngineKeyTest, TheRouterSendsTheFirstKeyOfItsFile) {
  WriteKeys(std::string("# the fleet's key\n") + kKey + "\n" + kStranger + "\n");
  auto router = StartRouter(true);
  const HttpReply whole = Complete(*router);
  EXPECT_EQ(whole.status, 200) << whole.body;
  const HttpReply streamed = Complete(*router, /*stream=*/true);
  EXPECT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_NE(streamed.body.find("[DONE]"), std::string::npos) << streamed.body;
  TestHttpClient models(router->port());
  EXPECT_EQ(models.Get("/v1/models").status, 200);
  // Straight to the engine, without the key: refused.
  TestHttpClient direct(engine_->port());
  EXPECT_EQ(direct.Post("/v1/completions", kRequest.dump()).status, 401);
}

TEST_F(RouterEngineKeyTest, AnEnginesRefusalIsCountedAndTheClientGets429) {
  auto router = StartRouter(false);
  const HttpReply reply = Complete(*router);
  EXPECT_EQ(reply.status, 429) << reply.body;
  EXPECT_NE(reply.body.find("engine key"), std::string::npos) << reply.body;
  const std::string metrics = Metrics(*router);
  const std::string series = "baton_router_upstream_errors_total{kind=\"engine_key\"} ";
  ASSERT_NE(metrics.find(series), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find(series + "0\n"), std::string::npos) << metrics;
}

TEST_F(RouterEngineKeyTest, AReloadTakesTheFilesNewFirstKeyAndABrokenFileKeepsIt) {
  WriteKeys(kStranger);
  auto router = StartRouter(true);
  EXPECT_EQ(Complete(*router).status, 429);
  WriteKeys(std::string(kNextKey) + "\n");
  ASSERT_TRUE(router->ReloadEngineKey().ok());
  HttpReply reply = Complete(*router);
  EXPECT_EQ(reply.status, 200) << reply.body;
  WriteKeys("short\n");
  const Status broken = router->ReloadEngineKey();
  EXPECT_FALSE(broken.ok());
  EXPECT_NE(broken.message().find("line 1: a key of 5 characters"), std::string::npos)
      << broken.message();
  reply = Complete(*router);
  EXPECT_EQ(reply.status, 200) << reply.body;
}

TEST_F(RouterEngineKeyTest, ABadKeyFileIsRefusedAtParseNamingTheFlag) {
  WriteKeys(std::string(kKey) + "\n");
  ::chmod(key_file_.c_str(), 0644);
  Result<RouterOptions> parsed = ParseRouterFlags({"--engine-key-file", key_file_});
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("engine-key-file: engine key file"), std::string::npos)
      << parsed.status().message();
  EXPECT_NE(parsed.status().message().find("open to every user"), std::string::npos);
  ::chmod(key_file_.c_str(), 0600);
  parsed = ParseRouterFlags({"--engine-key-file", key_file_});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->engine_key_file, key_file_);
  parsed = ParseRouterFlags({"--engine-key-file", "relative.key"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("want an absolute path"), std::string::npos);
}

}  // namespace
}  // namespace baton
