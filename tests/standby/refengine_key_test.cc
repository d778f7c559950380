// The reference engine given engine keys (BATON_ENGINE_KEYS, proto/http/engine_key.h): the
// real binary, standalone, on a generated tiny model.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/proto/http/http_test_client.h"
#include "tests/standby/tiny_engine.h"

namespace baton {
namespace {

constexpr char kKey[] = "first-engine-key-0123456789";
constexpr char kNextKey[] = "next+engine/key=0123456789";
constexpr char kCompletion[] = R"({"prompt": "ab", "max_tokens": 2, "temperature": 0})";

class RefEngineKeyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ScopedEnvVariable keys("BATON_ENGINE_KEYS", std::string(kKey) + "," + kNextKey);
    engine_ = new TinyEngine("baton-refengine-key");
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(engine_->port(), 0); }

  static TinyEngine* engine_;
};

TinyEngine* RefEngineKeyTest::engine_ = nullptr;

TEST_F(RefEngineKeyTest, ARequestWithoutAKeyGets401AndTheConnectionStaysUp) {
  TestHttpClient client(engine_->port());
  for (const std::string& authorization :
       {std::string(), std::string("Bearer wrong-key-0123456789"), std::string(kKey),
        std::string("Basic ") + kKey}) {
    client.SetAuthorization(authorization);
    for (const auto& [method, route] : {std::pair{http::verb::post, "/v1/completions"},
                                        std::pair{http::verb::post, "/v1/chat/completions"},
                                        std::pair{http::verb::get, "/v1/models"}}) {
      const HttpReply reply =
          client.Call(method, route, method == http::verb::post ? kCompletion : "");
      EXPECT_EQ(reply.status, 401) << route << " with '" << authorization << "': " << reply.body;
      EXPECT_EQ(reply.www_authenticate, "Bearer");
      const nlohmann::json error = nlohmann::json::parse(reply.body, nullptr, false)["error"];
      EXPECT_EQ(error["type"], "authentication_error") << reply.body;
      EXPECT_EQ(error["code"], "invalid_api_key") << reply.body;
      EXPECT_NE(error["message"].get<std::string>().find("engine key"), std::string::npos);
    }
  }
  // The same connection, now with a key: served.
  client.SetAuthorization(std::string("Bearer ") + kKey);
  EXPECT_EQ(client.Post("/v1/completions", kCompletion).status, 200);
}

TEST_F(RefEngineKeyTest, EitherKeyWithTheSchemeInAnyCaseIsServed) {
  TestHttpClient client(engine_->port());
  client.SetAuthorization(std::string("bearer ") + kNextKey);
  const HttpReply reply = client.Post("/v1/completions", kCompletion);
  EXPECT_EQ(reply.status, 200) << reply.body;
  client.SetAuthorization(std::string("Bearer ") + kKey);
  EXPECT_EQ(client.Get("/v1/models").status, 200);
}

TEST_F(RefEngineKeyTest, HealthAndMetricsNeedNoKeyAndCountTheRefusals) {
  TestHttpClient client(engine_->port());
  EXPECT_EQ(client.Get("/v1/models").status, 401);
  EXPECT_EQ(client.Get("/health").status, 200);
  const HttpReply metrics = client.Get("/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("code=\"401\""), std::string::npos) << metrics.body;
}

TEST(RefEngineKeys, ABadVariableStopsTheStartNamingItAndNotTheKey) {
  const std::string dir =
      ::testing::TempDir() + "baton-refengine-badkey-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  Result<ModelSummary> written = WriteModel(PresetSpec("tiny"), dir + "/model");
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  {
    ScopedEnvVariable keys("BATON_ENGINE_KEYS", std::string(kKey) + ",short-key");
    EngineProcess engine(dir, {"--model", dir + "/model"}, /*wait_for_port=*/false);
    EXPECT_EQ(engine.WaitForExit(), 1) << engine.log();
    EXPECT_NE(engine.log().find("BATON_ENGINE_KEYS, element 2: a key of 9 characters"),
              std::string::npos)
        << engine.log();
    EXPECT_EQ(engine.log().find(kKey), std::string::npos) << engine.log();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace baton
