// baton-router's Router in process, in front of a real baton-refengine (standalone, tiny
// model) used as a static backend: forwarding, streaming, authentication, limits and the
// errors when no engine answers.
#include "router/router.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/io/unique_fd.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/router/loopback_listener.h"
#include "tests/standby/tiny_engine.h"

namespace baton {
namespace {

using Json = nlohmann::json;

// A backend that listens and never accepts: connections land in its backlog and get no
// answer.
using SilentBackend = LoopbackListener;

// A backend that answers one request with an SSE stream: the first event at once, then,
// once Release() is called, either the end of the stream or (with `finish` false) a closed
// connection in the middle of it.
class HeldStreamBackend {
 public:
  explicit HeldStreamBackend(bool finish) {
    if (silent_.port() == 0) return;
    thread_ = std::thread([this, finish] { Serve(finish); });
  }
  ~HeldStreamBackend() {
    Release();
    silent_.Shutdown();  // a Serve still waiting in accept (no request came) returns
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return silent_.port(); }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!released_) released_promise_.set_value();
    released_ = true;
  }

 private:
  void Serve(bool finish) {
    UniqueFd conn(::accept4(silent_.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) return;
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = ::recv(conn.get(), buf, sizeof(buf), 0);
      if (n <= 0) return;
      request.append(buf, static_cast<size_t>(n));
    }
    Put(conn.get(),
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        "Transfer-Encoding: chunked\r\n\r\n" +
            Chunk("data: one\n\n"));
    released_promise_.get_future().wait();
    if (finish) Put(conn.get(), Chunk("data: [DONE]\n\n") + "0\r\n\r\n");
  }
  static std::string Chunk(const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    return size + data + "\r\n";
  }
  static void Put(int fd, const std::string& bytes) {
    (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }

  SilentBackend silent_;
  std::mutex mu_;
  bool released_ = false;
  std::promise<void> released_promise_;
  std::thread thread_;
};

class RouterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { engine_ = new TinyEngine("baton-router"); }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(engine_->port(), 0); }

  static std::string Backend() { return "127.0.0.1:" + std::to_string(engine_->port()); }

  // A started router with `options` (listening on an ephemeral port).
  static std::unique_ptr<Router> StartRouter(RouterOptions options) {
    options.listen_port = 0;
    auto router = std::make_unique<Router>(std::move(options));
    Status st = router->Start();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return router;
  }
  static std::unique_ptr<Router> StaticRouter() {
    RouterOptions options;
    options.backend = Backend();
    return StartRouter(options);
  }

  static Json Parse(const std::string& body) {
    Json j = Json::parse(body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << body;
    return j;
  }

  // The text and token ids of a streamed completion.
  static std::pair<std::string, std::vector<int32_t>> StreamOf(uint16_t port, Json body) {
    body["stream"] = true;
    TestHttpClient client(port);
    EXPECT_TRUE(client.Send(http::verb::post, "/v1/completions", body.dump()));
    EXPECT_EQ(client.ReadHeader(), 200);
    while (client.ReadMore()) {
    }
    std::vector<std::string> events = TestHttpClient::SplitEvents(client.body());
    EXPECT_FALSE(events.empty());
    if (events.empty()) return {};
    EXPECT_EQ(events.back(), "[DONE]");
    std::string text;
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      Json e = Parse(events[i]);
      text += e["choices"][0]["text"].get<std::string>();
      for (const Json& id : e["choices"][0]["token_ids"]) ids.push_back(id.get<int32_t>());
    }
    return {text, ids};
  }

  static void ExpectHealthy(uint16_t port) {
    TestHttpClient client(port);
    EXPECT_EQ(client.Get("/health").status, 200);
  }

  static TinyEngine* engine_;
};

TinyEngine* RouterTest::engine_ = nullptr;

const Json kRequest = {{"model", "tiny"},
                       {"prompt", "Through the router"},
                       {"max_tokens", 16},
                       {"seed", 21},
                       {"temperature", 0.8}};

TEST_F(RouterTest, CompletionEqualsTheDirectOne) {
  auto router = StaticRouter();
  TestHttpClient direct(engine_->port());
  HttpReply want = direct.Post("/v1/completions", kRequest.dump());
  ASSERT_EQ(want.status, 200) << want.body;
  TestHttpClient client(router->port());
  HttpReply got = client.Post("/v1/completions", kRequest.dump());
  ASSERT_EQ(got.status, 200) << got.body << got.error;
  EXPECT_EQ(got.content_type, want.content_type);
  EXPECT_EQ(Parse(got.body)["choices"], Parse(want.body)["choices"]);
  // Keep-alive: a second request on the same client connection.
  HttpReply again = client.Post("/v1/completions", kRequest.dump());
  ASSERT_EQ(again.status, 200);
  EXPECT_EQ(Parse(again.body)["choices"], Parse(want.body)["choices"]);
}

TEST_F(RouterTest, StreamEqualsTheDirectStream) {
  auto router = StaticRouter();
  auto want = StreamOf(engine_->port(), kRequest);
  auto got = StreamOf(router->port(), kRequest);
  ASSERT_FALSE(want.second.empty());
  EXPECT_EQ(got.first, want.first);
  EXPECT_EQ(got.second, want.second);
  ExpectHealthy(router->port());
}

TEST_F(RouterTest, StreamChunksArriveBeforeTheStreamEnds) {
  HeldStreamBackend backend(/*finish=*/true);
  ASSERT_NE(backend.port(), 0);
  RouterOptions options;
  options.backend = "127.0.0.1:" + std::to_string(backend.port());
  auto router = StartRouter(options);
  TestHttpClient client(router->port());
  ASSERT_TRUE(client.Send(http::verb::post, "/v1/completions", kRequest.dump()));
  ASSERT_EQ(client.ReadHeader(), 200);
  // The backend holds the rest of its stream until released: the first event can only get
  // here if the router relays it as it comes.
  ASSERT_TRUE(client.ReadEvents(1));
  EXPECT_EQ(TestHttpClient::SplitEvents(client.body()), std::vector<std::string>{"one"});
  EXPECT_FALSE(client.done());
  backend.Release();
  while (client.ReadMore()) {
  }
  EXPECT_TRUE(client.done());
  EXPECT_EQ(TestHttpClient::SplitEvents(client.body()),
            (std::vector<std::string>{"one", "[DONE]"}));
}

TEST_F(RouterTest, BrokenStreamEndsTheClientsStream) {
  HeldStreamBackend backend(/*finish=*/false);
  ASSERT_NE(backend.port(), 0);
  RouterOptions options;
  options.backend = "127.0.0.1:" + std::to_string(backend.port());
  auto router = StartRouter(options);
  TestHttpClient client(router->port());
  ASSERT_TRUE(client.Send(http::verb::post, "/v1/completions", kRequest.dump()));
  ASSERT_EQ(client.ReadHeader(), 200);
  ASSERT_TRUE(client.ReadEvents(1));
  backend.Release();
  while (client.ReadMore()) {
  }
  // The backend's events carry no token ids, so the stream cannot be continued elsewhere:
  // it ends with an explicit error event, never silently.
  std::vector<std::string> events = TestHttpClient::SplitEvents(client.body());
  ASSERT_EQ(events.size(), 3u) << client.body();
  EXPECT_EQ(events[0], "one");
  EXPECT_EQ(Parse(events[1])["error"]["code"], "engine_failed") << events[1];
  EXPECT_EQ(events[2], "[DONE]");
  // The count lands just after the client's stream ends: poll for it.
  bool counted = false;
  for (int i = 0; i < 1000 && !counted; ++i) {
    TestHttpClient metrics(router->port());
    counted = metrics.Get("/metrics")
                  .body.find("baton_router_upstream_errors_total{kind=\"broken\"} 1") !=
              std::string::npos;
    if (!counted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(counted);
  ExpectHealthy(router->port());
}

TEST_F(RouterTest, ModelsAndChatAreForwarded) {
  auto router = StaticRouter();
  TestHttpClient client(router->port());
  HttpReply models = client.Get("/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(Parse(models.body)["data"][0]["id"], "tiny");
  Json chat = {{"model", "tiny"},
               {"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
               {"max_tokens", 4},
               {"seed", 1}};
  TestHttpClient direct(engine_->port());
  HttpReply want = direct.Post("/v1/chat/completions", chat.dump());
  HttpReply got = client.Post("/v1/chat/completions", chat.dump());
  EXPECT_EQ(got.status, want.status) << got.body;
  EXPECT_EQ(Parse(got.body)["choices"], Parse(want.body)["choices"]);
}

TEST_F(RouterTest, ApiKey) {
  RouterOptions options;
  options.backend = Backend();
  options.api_key = "sekrit";
  auto router = StartRouter(options);
  TestHttpClient client(router->port());
  HttpReply denied = client.Post("/v1/completions", kRequest.dump());
  EXPECT_EQ(denied.status, 401);
  EXPECT_EQ(Parse(denied.body)["error"]["code"], "invalid_api_key") << denied.body;
  EXPECT_EQ(Parse(denied.body)["error"]["type"], "authentication_error") << denied.body;
  TestHttpClient wrong(router->port());
  const std::string body = kRequest.dump();
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n";
  ASSERT_TRUE(wrong.SendRaw(head + "Authorization: Bearer nope\r\n\r\n" + body));
  EXPECT_EQ(wrong.ReadHeader(), 401);
  TestHttpClient right(router->port());
  ASSERT_TRUE(right.SendRaw(head + "Authorization: Bearer sekrit\r\n\r\n" + body));
  EXPECT_EQ(right.ReadHeader(), 200);
  TestHttpClient lower(router->port());  // the scheme is case-insensitive
  ASSERT_TRUE(lower.SendRaw(head + "Authorization: bearer sekrit\r\n\r\n" + body));
  EXPECT_EQ(lower.ReadHeader(), 200);
  TestHttpClient bare(router->port());
  ASSERT_TRUE(bare.SendRaw(head + "Authorization: sekrit\r\n\r\n" + body));
  EXPECT_EQ(bare.ReadHeader(), 401);
  ExpectHealthy(router->port());  // /health needs no key
}

TEST_F(RouterTest, BodyLimit) {
  RouterOptions options;
  options.backend = Backend();
  options.max_body_bytes = 256;
  auto router = StartRouter(options);
  Json big = kRequest;
  big["prompt"] = std::string(1000, 'a');
  TestHttpClient client(router->port());
  EXPECT_EQ(client.Post("/v1/completions", big.dump()).status, 413);
  ExpectHealthy(router->port());
  TestHttpClient again(router->port());
  EXPECT_EQ(again.Post("/v1/completions", kRequest.dump()).status, 200);
}

TEST_F(RouterTest, NoPrimaryQueuesThen429) {
  RouterOptions options;
  options.controller_socket = engine_->dir() + "/no-controller.sock";
  options.max_queue_wait = std::chrono::milliseconds(100);
  auto router = StartRouter(options);
  TestHttpClient client(router->port());
  HttpReply r = client.Post("/v1/completions", kRequest.dump());
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.retry_after, "1");
  EXPECT_TRUE(Parse(r.body)["error"].is_object()) << r.body;
  const std::string metrics = client.Get("/metrics").body;
  EXPECT_NE(metrics.find(R"(baton_router_upstream_errors_total{kind="queue_timeout"} 1)"),
            std::string::npos)
      << metrics;
  EXPECT_EQ(client.Get("/health").status, 503);
  EXPECT_FALSE(router->routes().connected());
}

TEST_F(RouterTest, SilentBackendIs504) {
  SilentBackend silent;
  ASSERT_NE(silent.port(), 0);
  RouterOptions options;
  options.backend = "127.0.0.1:" + std::to_string(silent.port());
  options.first_byte_timeout = std::chrono::milliseconds(200);
  auto router = StartRouter(options);
  TestHttpClient client(router->port());
  HttpReply r = client.Post("/v1/completions", kRequest.dump());
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_TRUE(Parse(r.body)["error"].is_object()) << r.body;
  // Not streamed: a slow answer is not re-run on the same (or another) engine.
  const std::string metrics = client.Get("/metrics").body;
  EXPECT_NE(metrics.find("baton_router_replays_total{kind=\"retry\"} 0"), std::string::npos)
      << metrics;
  ExpectHealthy(router->port());
}

// A backend that refuses connections is not sent requests over and over: they wait in the
// queue and get 429 with Retry-After past max_queue_wait (nothing was done: the client may
// send them again), not 502.
TEST_F(RouterTest, RefusedBackendIs429AfterTheQueueWait) {
  const RefusedLoopbackPort gone;
  ASSERT_NE(gone.port(), 0);
  RouterOptions options;
  options.backend = "127.0.0.1:" + std::to_string(gone.port());
  // Retried until then. Each refusal queues the request anew, so a wait longer than that
  // between two probes (250 ms apart: retry_same_after) would end it as queue_timeout: an io
  // thread stalled on a loaded machine must not make it so.
  options.max_queue_wait = std::chrono::milliseconds(2000);
  auto router = StartRouter(options);
  TestHttpClient client(router->port());
  const HttpReply r = client.Post("/v1/completions", kRequest.dump());
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.retry_after, "2") << "the queue's wait, in whole seconds";
  const std::string metrics = client.Get("/metrics").body;
  EXPECT_NE(metrics.find("baton_router_upstream_errors_total{kind=\"unreachable\"} 1"),
            std::string::npos)
      << metrics;
  // Retried until the queue's wait, but one retry in the counter: one outage, many probes.
  EXPECT_NE(metrics.find("baton_router_replays_total{kind=\"retry\"} 1"), std::string::npos)
      << metrics;
  ExpectHealthy(router->port());
}

TEST_F(RouterTest, Metrics) {
  auto router = StaticRouter();
  {
    TestHttpClient client(router->port());
    ASSERT_EQ(client.Post("/v1/completions", kRequest.dump()).status, 200);
  }
  TestHttpClient client(router->port());
  EXPECT_EQ(client.Get("/v1/nothing").status, 404);
  EXPECT_EQ(client.Post("/v1/completions", "{\"prompt\": ").status, 400);  // counted by its route
  HttpReply m = client.Get("/metrics");
  ASSERT_EQ(m.status, 200);
  // The HTTP layer's own answers reach no route handler: counted as route "none".
  EXPECT_NE(m.body.find("baton_router_requests_total{route=\"none\",status=\"404\"} 1"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("baton_router_requests_total{route=\"/v1/completions\",status=\"200\"} 1"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("baton_router_has_primary 1"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("address=\"" + Backend() + "\""), std::string::npos) << m.body;
}

// Polls (up to 10 s) until the router's primary is `want` (nullopt: none).
bool WaitForPrimary(const Router& router, std::optional<std::string> want) {
  for (int i = 0; i < 1000; ++i) {
    if (router.routes().Primary() == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// One subscriber accepted on `listener`: Hello with role router, then Subscribe.
Result<proto::Channel> AcceptSubscriber(proto::Listener& listener) {
  BATON_ASSIGN_OR_RETURN(proto::Channel channel, listener.Accept(std::chrono::seconds(20)));
  BATON_ASSIGN_OR_RETURN(proto::AcceptedHello hello,
                         proto::ServerHello(channel, {.server_name = "fake-controller"}));
  if (hello.hello.role != proto::PeerRole::kRouter) {
    return FailedPrecondition(std::string("role ") + ToString(hello.hello.role));
  }
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(std::chrono::seconds(20)));
  BATON_RETURN_IF_ERROR(msg.As<proto::Subscribe>().status());
  return channel;
}

proto::RouteTable TableWith(uint64_t version, const std::string& address, bool ready) {
  proto::RouteTable table{.version = version, .epoch = version, .pair_state = "ready"};
  table.entries.push_back({.engine_id = 1,
                           .role = proto::EngineRole::kPrimary,
                           .http_address = address,
                           .ready = ready,
                           .weight = 100,
                           .engine_version = "ref"});
  table.entries.push_back({.engine_id = 2,
                           .role = proto::EngineRole::kStandby,
                           .http_address = "127.0.0.1:1",
                           .ready = false,
                           .weight = 0,
                           .engine_version = "ref"});
  return table;
}

TEST_F(RouterTest, FollowsTheControllersRouteTable) {
  boost::asio::io_context io;
  const std::string path = engine_->dir() + "/controller.sock";
  Result<proto::Listener> listener = proto::Listener::Bind(io, path);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  RouterOptions options;
  options.controller_socket = path;
  options.resubscribe_max_backoff = std::chrono::milliseconds(100);
  auto router = StartRouter(options);

  Result<proto::Channel> sub = AcceptSubscriber(*listener);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_TRUE(sub->Send(TableWith(1, Backend(), true)).ok());
  ASSERT_TRUE(WaitForPrimary(*router, Backend()));
  {
    TestHttpClient client(router->port());
    EXPECT_EQ(client.Post("/v1/completions", kRequest.dump()).status, 200);
  }

  // The controller goes away: the last table stays and requests still flow.
  sub->Close();
  listener->Close();
  for (int i = 0; i < 1000 && router->routes().connected(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(router->routes().connected());
  EXPECT_EQ(router->routes().Primary(), Backend());
  {
    TestHttpClient client(router->port());
    EXPECT_EQ(client.Post("/v1/completions", kRequest.dump()).status, 200);
  }

  // It comes back: the router resubscribes and follows the new table.
  Result<proto::Listener> again = proto::Listener::Bind(io, path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  Result<proto::Channel> sub2 = AcceptSubscriber(*again);
  ASSERT_TRUE(sub2.ok()) << sub2.status().ToString();
  ASSERT_TRUE(sub2->Send(TableWith(2, Backend(), false)).ok());
  ASSERT_TRUE(WaitForPrimary(*router, std::nullopt));
  TestHttpClient client(router->port());
  EXPECT_EQ(client.Get("/health").status, 503);
  EXPECT_EQ(router->routes().table().version, 2u);
}

}  // namespace
}  // namespace baton
