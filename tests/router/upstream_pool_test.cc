// Keep-alive connections from the router to its engines: requests reuse one connection, and
// a pooled connection the engine closed meanwhile is replaced unseen by the client.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "base/unique_fd.h"
#include "controller/router/router.h"
#include "tests/router/loopback_listener.h"
#include "tests/standby/http_test_client.h"

namespace baton {
namespace {

// A raw HTTP backend: answers every request with a small JSON body, keeps the connection for
// more requests, or (with `close_after_each`) closes it after each answer without saying so,
// as an engine whose idle timeout fired would.
class CountingBackend {
 public:
  explicit CountingBackend(bool close_after_each) : close_after_each_(close_after_each) {
    if (listener_.port() == 0) return;
    thread_ = std::thread([this] { Serve(); });
  }
  ~CountingBackend() {
    listener_.Shutdown();
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return listener_.port(); }
  int connections() const { return connections_.load(); }

 private:
  // One connection at a time is enough: the router sends one request at a time here.
  void Serve() {
    while (true) {
      UniqueFd conn(::accept(listener_.fd(), nullptr, nullptr));
      if (!conn.valid()) return;
      ++connections_;
      std::string in;
      char buf[4096];
      while (true) {
        const size_t end = in.find("\r\n\r\n");
        if (end != std::string::npos) {
          const size_t body = BodyLength(in.substr(0, end));
          if (in.size() >= end + 4 + body) {
            in.erase(0, end + 4 + body);
            const std::string answer = R"({"ok":true})";
            const std::string reply =
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                std::to_string(answer.size()) + "\r\n\r\n" + answer;
            (void)!::send(conn.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
            if (close_after_each_) break;
            continue;
          }
        }
        const ssize_t n = ::recv(conn.get(), buf, sizeof(buf), 0);
        if (n <= 0) break;
        in.append(buf, static_cast<size_t>(n));
      }
    }
  }
  static size_t BodyLength(const std::string& head) {
    const size_t at = head.find("Content-Length: ");
    return at == std::string::npos ? 0 : std::stoul(head.substr(at + 16));
  }

  const bool close_after_each_;
  LoopbackListener listener_;
  std::atomic<int> connections_{0};
  std::thread thread_;
};

std::unique_ptr<Router> RouterTo(uint16_t port) {
  RouterOptions options;
  options.listen_port = 0;
  options.backend = "127.0.0.1:" + std::to_string(port);
  auto router = std::make_unique<Router>(std::move(options));
  EXPECT_TRUE(router->Start().ok());
  return router;
}

TEST(UpstreamPoolTest, RequestsReuseOneEngineConnection) {
  CountingBackend backend(/*close_after_each=*/false);
  ASSERT_NE(backend.port(), 0);
  auto router = RouterTo(backend.port());
  for (int i = 0; i < 5; ++i) {
    TestHttpClient client(router->port());
    HttpReply r = client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})");
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(backend.connections(), 1);
}

TEST(UpstreamPoolTest, ConnectionClosedByTheEngineIsReplacedUnseen) {
  CountingBackend backend(/*close_after_each=*/true);
  ASSERT_NE(backend.port(), 0);
  auto router = RouterTo(backend.port());
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the close arrives first
    TestHttpClient client(router->port());
    HttpReply r = client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})");
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(backend.connections(), 5);
  TestHttpClient metrics(router->port());
  EXPECT_EQ(metrics.Get("/metrics").body.find("baton_router_upstream_errors_total{"),
            std::string::npos);
}

}  // namespace
}  // namespace baton
