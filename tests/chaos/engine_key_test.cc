// The engine key end to end (docs/operations.md, The engine key): a controller with
// [engine] key_file, a pair of reference engines, a router with the same file. Engines serve
// the router and refuse whoever comes to their ports without a key; a failover, a key added
// for a rotation, a key file broken meanwhile and the router told of the swapped keys
// (SIGHUP) take nothing out of service.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <thread>

#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/router_stream_support.h"
#include "tests/proto/http/http_test_client.h"

namespace baton::chaos {
namespace {

constexpr char kKey[] = "chaos-engine-key-0123456789abcdef";
constexpr char kNextKey[] = "chaos-next-engine-key-0123456789";

void WriteKeyFile(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp", std::ios::trunc) << text;
  ::chmod((path + ".tmp").c_str(), 0600);
  std::filesystem::rename(path + ".tmp", path);
}

// The HTTP port of `engine` (its http_address, 127.0.0.1:PORT).
uint16_t HttpPort(const json& engine) {
  const std::string address = engine.value("http_address", std::string());
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

// `route` of the engine with `role`, with `authorization` ("" for none): the status.
int EngineAnswer(const json& status, const std::string& role, const std::string& authorization) {
  const json engine = EngineWithRole(status, role);
  if (engine.is_null()) return -1;
  TestHttpClient client(HttpPort(engine));
  client.SetAuthorization(authorization);
  return client.Get("/v1/models").status;
}

int ThroughRouter(const RouterProcess& router) {
  const json request = {{"model", kRouterTestModel}, {"prompt", "key"}, {"max_tokens", 4}};
  const Reply reply = Fetch(router.port(), http::verb::post, "/v1/completions", request.dump(),
                            std::chrono::seconds(20));
  EXPECT_EQ(reply.status, 200) << reply.body << reply.error << router.Log();
  return reply.status;
}

TEST(ChaosEngineKey, EnginesServeOnlyTheRouterThroughFailoversAndARotation) {
  const std::string key_dir =
      ::testing::TempDir() + "baton-chaos-key-" + std::to_string(::getpid());
  std::filesystem::create_directories(key_dir);
  const std::string key_file = key_dir + "/engine.key";
  WriteKeyFile(key_file, std::string(kKey) + "\n");
  ClusterOptions options = RefenginePair();
  options.engine_key_file = key_file;
  {
    ChaosCluster cluster(options);
    json status = cluster.Status();
    EXPECT_EQ(status["controller"]["engine_key_file"], key_file);
    EXPECT_TRUE(status["degraded"].empty()) << status["degraded"].dump();
    RouterProcess router({"--controller", cluster.socket(), "--engine-key-file", key_file},
                         cluster.dir(), "router.log");
    ASSERT_TRUE(router.ready()) << router.Log();
    ThroughRouter(router);
    const std::string bearer = std::string("Bearer ") + kKey;
    for (const char* role : {"primary", "standby"}) {
      EXPECT_EQ(EngineAnswer(status, role, ""), 401) << role;
      EXPECT_EQ(EngineAnswer(status, role, "Bearer " + std::string(kNextKey)), 401) << role;
      EXPECT_EQ(EngineAnswer(status, role, bearer), 200) << role;
    }

    // A rotation's first step: the new key added second. The engines running keep the old
    // one; the next one launched takes both, and the router still sends the first.
    WriteKeyFile(key_file, std::string(kKey) + "\n" + kNextKey + "\n");
    uint64_t primary = PrimaryId(status);
    ASSERT_EQ(::kill(PidOf(EngineWithRole(status, "primary")), SIGKILL), 0);
    status = WaitNewPrimary(cluster, primary, "the standby promoted");
    ThroughRouter(router);
    EXPECT_EQ(EngineAnswer(status, "primary", "Bearer " + std::string(kNextKey)), 401);
    EXPECT_EQ(EngineAnswer(status, "standby", "Bearer " + std::string(kNextKey)), 200);
    EXPECT_EQ(EngineAnswer(status, "standby", bearer), 200);
    EXPECT_NE(cluster.Log().find("engine key file " + key_file + " changed: engines launched " +
                                 "from now on take its 2 keys"),
              std::string::npos)
        << cluster.Log();

    // A key file broken meanwhile: the next engine gets the keys read last; nothing stops.
    WriteKeyFile(key_file, "short\n");
    primary = PrimaryId(status);
    ASSERT_EQ(::kill(PidOf(EngineWithRole(status, "primary")), SIGKILL), 0);
    status = WaitNewPrimary(cluster, primary, "the standby promoted with the key file broken");
    ThroughRouter(router);
    EXPECT_EQ(EngineAnswer(status, "standby", "Bearer " + std::string(kNextKey)), 200);
    EXPECT_NE(cluster.Log().find("line 1: a key of 5 characters (keys have 16 to 1024): this "
                                 "engine gets the 2 keys read before"),
              std::string::npos)
        << cluster.Log();

    // Every engine now takes both keys: the rotation swaps them and tells the router (SIGHUP).
    WriteKeyFile(key_file, std::string(kNextKey) + "\n" + kKey + "\n");
    router.Signal(SIGHUP);
    const std::string reread = "SIGHUP: engine key file " + key_file + " read again";
    for (int i = 0; i < 1000 && router.Log().find(reread) == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_NE(router.Log().find(reread), std::string::npos) << router.Log();
    ThroughRouter(router);
    EXPECT_TRUE(router.Running());
    for (const char* key : {kKey, kNextKey}) {
      EXPECT_EQ(cluster.Log().find(key), std::string::npos) << "a key in the controller's log";
      EXPECT_EQ(router.Log().find(key), std::string::npos) << "a key in the router's log";
    }
    cluster.CheckFencing();
  }
  std::filesystem::remove_all(key_dir);
}

}  // namespace
}  // namespace baton::chaos
