// The router's client-side limits with raw sockets: a slowloris-style client gets 408 and
// is cut off, the connection limit answers 503, an oversized header 431, an idle
// connection is closed; after each the router still serves. Engine-side failures (silent
// backend, broken stream, no primary) are in router_test.cc and replay_test.cc.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/io/unique_fd.h"
#include "router/router.h"
#include "tests/router/loopback_listener.h"
#include "tests/router/wait_for.h"

namespace baton {
namespace {

using std::chrono::milliseconds;

UniqueFd Connect(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

bool Put(int fd, const std::string& s) {
  return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

// Everything until the peer closes (or the receive timeout).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

int StatusOf(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0) return -1;
  return std::stoi(response.substr(9, 3));
}

// A one-request engine on loopback: it answers with a chunked event stream made of
// `chunks` and then holds the connection open (no last chunk) until the router closes it.
class ChunkedEngine {
 public:
  explicit ChunkedEngine(std::vector<std::string> chunks)
      : thread_([this, chunks = std::move(chunks)] { Serve(chunks); }) {}
  // A test that stopped early (a failed ASSERT) leaves Serve waiting in accept, or on the
  // connection the router holds: both are shut down, so that the thread ends.
  ~ChunkedEngine() {
    Shutdown();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      if (conn_.valid()) ::shutdown(conn_.get(), SHUT_RDWR);
    }
    if (thread_.joinable()) thread_.join();
  }
  ChunkedEngine(const ChunkedEngine&) = delete;
  ChunkedEngine& operator=(const ChunkedEngine&) = delete;
  uint16_t port() const { return listener_.port(); }
  void Shutdown() { listener_.Shutdown(); }
  void Join() { thread_.join(); }

 private:
  void Serve(const std::vector<std::string>& chunks) {
    UniqueFd accepted(::accept(listener_.fd(), nullptr, nullptr));
    if (!accepted.valid()) return;
    int conn_fd = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      conn_ = std::move(accepted);
      conn_fd = conn_.get();  // closed by the destructor, after this thread ended
    }
    char buf[4096];
    (void)!::recv(conn_fd, buf, sizeof(buf), 0);
    bool sent = Put(conn_fd,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n");
    for (const std::string& chunk : chunks) {
      char size[32];
      std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
      sent = sent && Put(conn_fd, size + chunk + "\r\n");
    }
    while (::recv(conn_fd, buf, sizeof(buf), 0) > 0) {  // open until the router closes it
    }
  }

  LoopbackListener listener_;  // before thread_: it listens before Serve runs
  std::mutex mu_;
  bool stopping_ = false;  // guarded by mu_
  UniqueFd conn_;          // guarded by mu_; the connection Serve accepted
  std::thread thread_;
};

// A streamed completion's request, as a client sends it.
std::string StreamRequest(const std::string& body, bool close) {
  return std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\n") +
         (close ? "Connection: close\r\n" : "") +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

class RouterLimitsTest : public ::testing::Test {
 protected:
  void Start(RouterOptions options) {
    options.listen_port = 0;
    options.controller_socket = "/nonexistent/controller.sock";
    options.max_queue_wait = milliseconds(50);
    router_ = std::make_unique<Router>(std::move(options));
    ASSERT_TRUE(router_->Start().ok());
  }
  // The router still answers: /health (503, as no engine is configured).
  void ExpectServing() {
    UniqueFd fd = Connect(router_->port());
    ASSERT_TRUE(Put(fd.get(), "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    EXPECT_EQ(StatusOf(ReadAll(fd.get())), 503);
  }
  std::string MetricsText() {
    UniqueFd fd = Connect(router_->port());
    EXPECT_TRUE(Put(fd.get(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    return ReadAll(fd.get());
  }
  // The router goes first: the engine's connection ends when the router closes it.
  void StopWith(ChunkedEngine& engine) {
    engine.Shutdown();
    router_.reset();
    engine.Join();
  }
  std::unique_ptr<Router> router_;
};

TEST_F(RouterLimitsTest, SlowlorisClientGets408AndIsCut) {
  RouterOptions options;
  options.request_timeout = milliseconds(300);
  Start(options);
  UniqueFd fd = Connect(router_->port());
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  std::string response;
  // One byte every 50 ms: each read makes progress, but the request never completes.
  for (size_t i = 0; i < 40 && response.empty(); ++i) {
    if (!Put(fd.get(), std::string(1, i < head.size() ? head[i] : 'a'))) break;
    std::this_thread::sleep_for(milliseconds(50));
    char buf[512];
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) response.assign(buf, static_cast<size_t>(n));
  }
  response += ReadAll(fd.get());
  EXPECT_EQ(StatusOf(response), 408) << response;
  ExpectServing();
}

TEST_F(RouterLimitsTest, ConnectionLimitAnswers503) {
  RouterOptions options;
  options.max_connections = 2;
  Start(options);
  UniqueFd a = Connect(router_->port());
  UniqueFd b = Connect(router_->port());
  std::this_thread::sleep_for(milliseconds(100));  // both accepted
  UniqueFd c = Connect(router_->port());
  const std::string refused = ReadAll(c.get());
  EXPECT_EQ(StatusOf(refused), 503) << refused;
  EXPECT_NE(refused.find("too many connections"), std::string::npos);
  a.Reset();
  b.Reset();
  std::this_thread::sleep_for(milliseconds(100));
  ExpectServing();
}

TEST_F(RouterLimitsTest, OversizedHeaderIs431) {
  RouterOptions options;
  options.max_header_bytes = 1024;
  Start(options);
  UniqueFd fd = Connect(router_->port());
  ASSERT_TRUE(Put(fd.get(), "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4000, 'b') +
                                "\r\n\r\n"));
  EXPECT_EQ(StatusOf(ReadAll(fd.get())), 431);
  ExpectServing();
}

TEST_F(RouterLimitsTest, IdleConnectionIsClosed) {
  RouterOptions options;
  options.client_idle_timeout = milliseconds(200);
  Start(options);
  UniqueFd fd = Connect(router_->port());
  EXPECT_EQ(ReadAll(fd.get()), "");  // closed by the router, nothing sent
  ExpectServing();
}

TEST_F(RouterLimitsTest, QueueFullIs429WithRetryAfter) {
  RouterOptions options;
  options.max_queue = 0;
  Start(options);
  UniqueFd fd = Connect(router_->port());
  const std::string body = R"({"prompt":"x"})";
  ASSERT_TRUE(Put(fd.get(),
                  "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  "Content-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body));
  const std::string response = ReadAll(fd.get());
  EXPECT_EQ(StatusOf(response), 429) << response;
  EXPECT_NE(response.find("Retry-After: 1"), std::string::npos) << response;
  EXPECT_NE(response.find(R"("type":"rate_limit_error")"), std::string::npos) << response;
  EXPECT_NE(response.find(R"("code":"rate_limit_exceeded")"), std::string::npos) << response;
  const std::string metrics = MetricsText();
  EXPECT_NE(metrics.find(R"(baton_router_upstream_errors_total{kind="queue_full"} 1)"),
            std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find(R"(kind="queue_timeout")"), std::string::npos) << metrics;
  ExpectServing();
}

// An engine whose stream never ends an event (no blank line) does not make the router hold
// its bytes: past 4 MiB the attempt is broken and the client is told, while the engine still
// holds the connection open.
TEST_F(RouterLimitsTest, AnEndlessStreamEventBreaksTheAttempt) {
  ChunkedEngine engine(
      std::vector<std::string>(5, "data: " + std::string(1 << 20, 'x')));  // never a blank line
  ASSERT_NE(engine.port(), 0);
  RouterOptions options;
  options.backend = "127.0.0.1:" + std::to_string(engine.port());
  options.migration_limit = 0;
  Start(options);
  UniqueFd fd = Connect(router_->port());
  ASSERT_TRUE(Put(fd.get(), StreamRequest(R"({"prompt":"x","max_tokens":4,"stream":true})",
                                          /*close=*/true)));
  const std::string response = ReadAll(fd.get());
  EXPECT_NE(response.find("error"), std::string::npos) << response.substr(0, 400);
  EXPECT_LT(response.size(), 64u << 10) << "the engine's bytes reached the client";
  StopWith(engine);
}

// A client that closes as soon as it reads [DONE], before the engine ends its response,
// got its whole stream: the request is counted as answered, not as a client gone (499).
TEST_F(RouterLimitsTest, AClientLeavingAfterDoneIsNoClientGone) {
  ChunkedEngine engine(
      {"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"a\",\"token_ids\":[97],"
       "\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n"});
  ASSERT_NE(engine.port(), 0);
  RouterOptions options;
  options.backend = "127.0.0.1:" + std::to_string(engine.port());
  Start(options);
  {
    UniqueFd fd = Connect(router_->port());
    ASSERT_TRUE(Put(fd.get(), StreamRequest(R"({"prompt":"x","max_tokens":1,"stream":true})",
                                            /*close=*/false)));
    std::string got;
    char buf[4096];
    while (got.find("[DONE]") == std::string::npos) {
      const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
      ASSERT_GT(n, 0) << got;
      got.append(buf, static_cast<size_t>(n));
    }
  }  // closed at once, as an OpenAI client does
  std::string metrics;
  EXPECT_TRUE(WaitFor([&] {
    metrics = MetricsText();
    return metrics.find(R"(route="/v1/completions",status="200"} 1)") != std::string::npos;
  })) << metrics;
  EXPECT_NE(metrics.find(R"(baton_router_requests_total{route="/v1/completions",status="200"} 1)"),
            std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find(R"(kind="client_gone")"), std::string::npos) << metrics;
  StopWith(engine);
}

TEST_F(RouterLimitsTest, DeeplyNestedBodyIs400) {
  Start(RouterOptions{});
  for (const char* route : {"/v1/completions", "/v1/chat/completions"}) {
    UniqueFd fd = Connect(router_->port());
    const std::string body =
        R"({"prompt":"x","x":)" + std::string(50000, '[') + std::string(50000, ']') + "}";
    ASSERT_TRUE(Put(fd.get(), std::string("POST ") + route +
                                  " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                  "Content-Type: application/json\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\n\r\n" + body));
    const std::string response = ReadAll(fd.get());
    EXPECT_EQ(StatusOf(response), 400) << route;
    EXPECT_NE(response.find("nests deeper than"), std::string::npos) << response;
  }
  ExpectServing();
}

}  // namespace
}  // namespace baton
