// baton-router's Router in process, behind a fake controller that publishes the tables of
// `batonctl drain` (pair `draining`, then `stopped`) and of `batonctl resume`: requests get
// 503 `out_of_service` at once, the queued ones when the drain's table arrives too, /health
// says `out_of_service`, and the resumed pair serves again. A pair merely down still queues.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "router/admission.h"
#include "router/router.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/proto/proto_test_util.h"
#include "tests/router/scripted_backend.h"

namespace baton {
namespace {

using Json = nlohmann::json;
using std::chrono::milliseconds;

const std::string kRequest = R"({"model":"tiny","prompt":"x","max_tokens":4})";

// One subscriber accepted on `listener`: Hello with role router, then Subscribe.
Result<proto::Channel> AcceptSubscriber(proto::Listener& listener) {
  BATON_ASSIGN_OR_RETURN(proto::Channel channel, listener.Accept(std::chrono::seconds(20)));
  BATON_ASSIGN_OR_RETURN(proto::AcceptedHello hello,
                         proto::ServerHello(channel, {.server_name = "fake-controller"}));
  (void)hello;
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(std::chrono::seconds(20)));
  BATON_RETURN_IF_ERROR(msg.As<proto::Subscribe>().status());
  return channel;
}

// A table at `pair_state`; engine 1 at `address` as primary when `address` is not empty.
proto::RouteTable TableAt(uint64_t version, const std::string& pair_state,
                          const std::string& address = "") {
  proto::RouteTable table{.version = version, .epoch = 1, .pair_state = pair_state};
  if (!address.empty()) {
    table.entries.push_back({.engine_id = 1,
                             .role = proto::EngineRole::kPrimary,
                             .http_address = address,
                             .ready = true,
                             .weight = 100});
  }
  return table;
}

class RouterOutOfServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<proto::Listener> listener = proto::Listener::Bind(io_, dir_.File("controller.sock"));
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_.emplace(std::move(*listener));
    RouterOptions options;
    options.listen_port = 0;
    options.controller_socket = dir_.File("controller.sock");
    // Far past the test: a request that is answered was not answered by the queue's wait.
    options.max_queue_wait = milliseconds(20000);
    router_ = std::make_unique<Router>(std::move(options));
    ASSERT_TRUE(router_->Start().ok());
    Result<proto::Channel> sub = AcceptSubscriber(*listener_);
    ASSERT_TRUE(sub.ok()) << sub.status().ToString();
    sub_.emplace(std::move(*sub));
  }

  // Publishes `table` and waits (up to 10 s) for the router's admission to apply it.
  void Publish(const proto::RouteTable& table) {
    ASSERT_TRUE(sub_->Send(table).ok());
    auto applied = [&] {
      return router_->routes().table().version == table.version &&
             router_->admission().OutOfService() == IsOutOfService(table) &&
             router_->admission().Primary().has_value() == !table.entries.empty();
    };
    for (int i = 0; i < 1000 && !applied(); ++i) std::this_thread::sleep_for(milliseconds(10));
    ASSERT_TRUE(applied()) << "table v" << table.version << " not applied";
  }

  Json Health(int* status) {
    TestHttpClient client(router_->port());
    HttpReply r = client.Get("/health");
    *status = r.status;
    return Json::parse(r.body, nullptr, false);
  }

  static void ExpectOutOfService(const HttpReply& r) {
    EXPECT_EQ(r.status, 503) << r.body;
    const Json body = Json::parse(r.body, nullptr, false);
    ASSERT_TRUE(body.contains("error")) << r.body;
    EXPECT_EQ(body["error"]["code"], "out_of_service") << r.body;
    EXPECT_EQ(body["error"]["type"], "server_error") << r.body;
    EXPECT_NE(body["error"]["message"].get<std::string>().find("batonctl resume"),
              std::string::npos)
        << r.body;
    EXPECT_TRUE(r.retry_after.empty()) << "no engine comes back by itself";
  }

  proto::testing::TempDir dir_;
  boost::asio::io_context io_;
  std::optional<proto::Listener> listener_;
  std::optional<proto::Channel> sub_;
  std::unique_ptr<Router> router_;
};

TEST_F(RouterOutOfServiceTest, AStoppedPairAnswers503AtOnceUntilResumed) {
  const std::string done = ScriptedBackend::Chunked("application/json", {R"({"choices":[]})"});
  ScriptedBackend backend({done});
  ASSERT_NE(backend.port(), 0);
  Publish(TableAt(1, "stopped"));
  ExpectOutOfService(TestHttpClient(router_->port()).Post("/v1/completions", kRequest));
  int status = 0;
  Json health = Health(&status);
  EXPECT_EQ(status, 503);
  EXPECT_EQ(health["status"], "out_of_service") << health.dump();
  EXPECT_EQ(health["primary"], "") << health.dump();
  EXPECT_TRUE(health.contains("controller_connected")) << health.dump();
  const std::string metrics = TestHttpClient(router_->port()).Get("/metrics").body;
  EXPECT_NE(metrics.find(R"(baton_router_requests_total{route="/v1/completions",status="503"} 1)"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find(R"(baton_router_upstream_errors_total{kind="out_of_service"} 1)"),
            std::string::npos)
      << metrics;

  // `batonctl resume`: the new pair is down until its primary is ready, then serves.
  Publish(TableAt(2, "down"));
  health = Health(&status);
  EXPECT_EQ(health["status"], "no_primary") << health.dump();
  Publish(TableAt(3, "ready", "127.0.0.1:" + std::to_string(backend.port())));
  EXPECT_EQ(TestHttpClient(router_->port()).Post("/v1/completions", kRequest).status, 200);
  health = Health(&status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(health["status"], "ok") << health.dump();
}

// A request queued while the pair is down (no primary: it waits) gets the 503 as soon as the
// drain's table arrives, not at the end of the queue's wait.
TEST_F(RouterOutOfServiceTest, AQueuedRequestGets503WhenThePairIsDrained) {
  Publish(TableAt(1, "down"));
  TestHttpClient client(router_->port());
  ASSERT_TRUE(client.Send(http::verb::post, "/v1/completions", kRequest));
  for (int i = 0; i < 1000 && router_->admission().queued() == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(router_->admission().queued(), 1u) << "a pair that is down queues";
  Publish(TableAt(2, "stopped"));
  EXPECT_EQ(client.ReadHeader(), 503);
  while (client.ReadMore()) {
  }
  const Json body = Json::parse(client.body(), nullptr, false);
  EXPECT_EQ(body["error"]["code"], "out_of_service") << client.body();
  EXPECT_EQ(router_->admission().queued(), 0u);
}

}  // namespace
}  // namespace baton
