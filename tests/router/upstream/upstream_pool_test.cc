// Keep-alive connections from the router to its engines: requests reuse one connection, and
// a pooled connection the engine closed meanwhile is replaced unseen by the client.
#include "router/upstream/upstream_pool.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>

#include "base/io/unique_fd.h"
#include "router/router.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/router/loopback_listener.h"

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
  // No attempt failed: every upstream error series (engine_key's is there from the start) is 0.
  TestHttpClient metrics(router->port());
  std::istringstream lines(metrics.Get("/metrics").body);
  int series = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("baton_router_upstream_errors_total{", 0) != 0) continue;
    ++series;
    EXPECT_EQ(line.substr(line.rfind(' ')), " 0") << line;
  }
  EXPECT_EQ(series, 1) << "only engine_key's, at 0";
}

// Reads from `fd` until one whole request (headers and Content-Length body) is in; false if
// the peer closed first.
bool ReadRequest(int fd) {
  std::string in;
  char buf[4096];
  while (true) {
    const size_t end = in.find("\r\n\r\n");
    if (end != std::string::npos) {
      const size_t at = in.find("Content-Length: ");
      const size_t body = at == std::string::npos || at > end ? 0 : std::stoul(in.substr(at + 16));
      if (in.size() >= end + 4 + body) return true;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    in.append(buf, static_cast<size_t>(n));
  }
}

// A hand-written engine's only door: a socket listening on a free loopback port (0 when it
// could not be made). Once the engine is gone (listener.Shutdown()) the port refuses
// connections for the rest of the test: it stays held, so that no other test takes it.
struct RawEngine {
  RefusedLoopbackPort held;
  LoopbackListener listener{held};
};

// Waits (up to 30 s) until the FIN sent on the connected socket `fd` is acknowledged by its
// peer's kernel (FIN_WAIT2, or past it): the peer reads end-of-stream from then on.
bool FinAcknowledged(int fd) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
    if (info.tcpi_state == TCP_FIN_WAIT2 || info.tcpi_state == TCP_TIME_WAIT ||
        info.tcpi_state == TCP_CLOSE) {
      return true;
    }
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Reads one request from `fd` and answers it with a small JSON body, keeping the connection;
// false if the peer closed first.
bool AnswerOne(int fd) {
  if (!ReadRequest(fd)) return false;
  const std::string reply =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
      R"({"ok":true})";
  (void)!::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
  return true;
}

// A router to 127.0.0.1:`port` that moves no request (migration_limit 0): the first failed
// attempt that counts is the client's answer.
std::unique_ptr<Router> StrictRouterTo(uint16_t port, std::chrono::milliseconds max_queue_wait) {
  RouterOptions options;
  options.listen_port = 0;
  options.backend = "127.0.0.1:" + std::to_string(port);
  options.migration_limit = 0;
  options.max_queue_wait = max_queue_wait;
  auto router = std::make_unique<Router>(std::move(options));
  return router->Start().ok() ? std::move(router) : nullptr;
}

// The engine dies holding the request (it read it from a kept-alive connection, then is
// gone, its port closed): the attempt broke, it was not refused. It counts against the
// migration limit (here 0: the client gets 502 at once) and is counted as "broken".
TEST(UpstreamPoolTest, AnEngineGoneWithARequestOnAPooledConnectionIsABrokenAttempt) {
  RawEngine raw;
  ASSERT_NE(raw.listener.port(), 0);
  // Made before the engine's thread: no ASSERT returns while the thread runs.
  auto router = StrictRouterTo(raw.listener.port(), std::chrono::milliseconds(5000));
  ASSERT_NE(router, nullptr);
  std::thread engine([&] {
    UniqueFd conn(::accept(raw.listener.fd(), nullptr, nullptr));
    if (!conn.valid() || !AnswerOne(conn.get())) return;
    if (!ReadRequest(conn.get())) return;
    raw.listener.Shutdown();  // the engine is gone: its port refuses connections
  });
  TestHttpClient client(router->port());
  EXPECT_EQ(client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})").status, 200);
  HttpReply second = client.Post("/v1/completions", R"({"prompt":"y","max_tokens":1})");
  engine.join();
  EXPECT_EQ(second.status, 502) << second.body;
  const std::string metrics = TestHttpClient(router->port()).Get("/metrics").body;
  EXPECT_NE(metrics.find(R"(baton_router_upstream_errors_total{kind="broken"} 1)"),
            std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find(R"(baton_router_upstream_errors_total{kind="connect"})"),
            std::string::npos)
      << metrics;
}

// The engine is killed between two requests (kill -9: the kernel closes its connections and
// its port): the pooled connection it closed is not used, so the request never reaches a dead
// engine, is not counted against the migration limit (here 0), and waits for a route as a
// refused connection does; with no engine back it gets 429 once max_queue_wait has passed.
TEST(UpstreamPoolTest, AConnectionTheEngineClosedIsNotTakenFromThePool) {
  RawEngine raw;
  ASSERT_NE(raw.listener.port(), 0);
  // Made before the engine's thread: no ASSERT returns while the thread runs.
  auto router = StrictRouterTo(raw.listener.port(), std::chrono::milliseconds(300));
  ASSERT_NE(router, nullptr);
  std::atomic<bool> gone{false};
  std::thread engine([&] {
    UniqueFd conn(::accept(raw.listener.fd(), nullptr, nullptr));
    if (!conn.valid() || !AnswerOne(conn.get())) return;
    // The engine is gone before the next request: port and connection. Its FIN is in at the
    // router once the router's side acknowledged it.
    raw.listener.Shutdown();
    gone = ::shutdown(conn.get(), SHUT_WR) == 0 && FinAcknowledged(conn.get());
  });
  TestHttpClient client(router->port());
  EXPECT_EQ(client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})").status, 200);
  engine.join();
  ASSERT_TRUE(gone.load()) << "the router's side did not acknowledge the engine's FIN";
  HttpReply second = client.Post("/v1/completions", R"({"prompt":"y","max_tokens":1})");
  EXPECT_EQ(second.status, 429) << second.body;
  const std::string metrics = TestHttpClient(router->port()).Get("/metrics").body;
  EXPECT_EQ(metrics.find(R"(baton_router_upstream_errors_total{kind="broken"})"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find(R"(baton_router_upstream_errors_total{kind="connect"})"),
            std::string::npos)
      << metrics;
}

// Engines on ports never used again (each failover's new engine gets a fresh port) leave no
// idle connections behind: a Put for any address drops every expired one.
// An open connection to a listener nobody accepts from: idle, as a kept-alive engine's is.
std::unique_ptr<UpstreamPool::Stream> IdleConnection(boost::asio::io_context& io,
                                                     const LoopbackListener& to) {
  auto stream = std::make_unique<UpstreamPool::Stream>(io);
  boost::system::error_code ec;
  stream->socket().connect({boost::asio::ip::make_address("127.0.0.1"), to.port()}, ec);
  EXPECT_FALSE(ec) << ec.message();
  return stream;
}

TEST(UpstreamPoolTest, ExpiredConnectionsOfAnyAddressAreDroppedOnPut) {
  boost::asio::io_context io;
  LoopbackListener listener;
  ASSERT_NE(listener.port(), 0);
  FakeClock clock;
  UpstreamPool pool(clock, 32, std::chrono::seconds(30));
  pool.Put("127.0.0.1:1", IdleConnection(io, listener));
  pool.Put("127.0.0.1:1", IdleConnection(io, listener));
  EXPECT_EQ(pool.idle(), 2u);
  clock.Advance(std::chrono::seconds(31));
  pool.Put("127.0.0.1:2", IdleConnection(io, listener));
  EXPECT_EQ(pool.idle(), 1u) << "the dead engine's connections were kept";
  EXPECT_EQ(pool.Take("127.0.0.1:1"), nullptr);
  EXPECT_NE(pool.Take("127.0.0.1:2"), nullptr);
}

TEST(UpstreamPoolTest, AnAddressThatRefusesIsForgotten) {
  boost::asio::io_context io;
  LoopbackListener listener;
  ASSERT_NE(listener.port(), 0);
  FakeClock clock;
  UpstreamPool pool(clock);
  pool.Put("127.0.0.1:1", IdleConnection(io, listener));
  pool.Put("127.0.0.1:2", IdleConnection(io, listener));
  pool.Forget("127.0.0.1:1");
  EXPECT_EQ(pool.Take("127.0.0.1:1"), nullptr);
  EXPECT_NE(pool.Take("127.0.0.1:2"), nullptr);
}

}  // namespace
}  // namespace baton
