// The controller's /metrics endpoint (controller/ctl/metrics_server.cc) under hostile clients:
// out of fds, too many connections at once.
#include "controller/ctl/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/io/unique_fd.h"

namespace baton {
namespace {

using std::chrono::milliseconds;

// A client connected to 127.0.0.1:port (the kernel completes it before any accept).
UniqueFd Connect(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(fd) << std::strerror(errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  return fd;
}

void Send(int fd, const std::string& text) {
  ASSERT_EQ(::send(fd, text.data(), text.size(), MSG_NOSIGNAL), static_cast<ssize_t>(text.size()));
}

// What the server sent so far, without waiting; `closed` tells whether it closed (EOF or reset).
std::string Received(int fd, bool* closed) {
  std::string text;
  *closed = false;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      continue;
    }
    *closed = n == 0 || errno == ECONNRESET;
    return text;
  }
}

milliseconds ThreadCpuTime() {
  rusage usage{};
  ::getrusage(RUSAGE_THREAD, &usage);
  const auto us = [](const timeval& t) { return t.tv_sec * 1'000'000L + t.tv_usec; };
  return milliseconds((us(usage.ru_utime) + us(usage.ru_stime)) / 1000);
}

// Every fd this process may still open taken, until it ends.
class NoFdsLeft {
 public:
  NoFdsLeft() {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit low = saved_;
    low.rlim_cur = std::min<rlim_t>(saved_.rlim_cur, 512);
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    for (;;) {
      UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (!fd) break;
      taken_.push_back(std::move(fd));
    }
    EXPECT_EQ(errno, EMFILE);
  }
  ~NoFdsLeft() {
    taken_.clear();
    ::setrlimit(RLIMIT_NOFILE, &saved_);
  }

 private:
  rlimit saved_{};
  std::vector<UniqueFd> taken_;
};

std::unique_ptr<MetricsServer> StartServer(boost::asio::io_context& io) {
  auto server = MetricsServer::Start(io, "127.0.0.1", 0, [] { return std::string("up 1\n"); });
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server).value() : nullptr;
}

// Out of fds, an accept fails and the connection stays queued: accepting again at once would
// fail again at once, a loop at 100 % CPU. The server waits, and serves the client once fds
// are free again.
TEST(MetricsServer, AFailedAcceptIsRetriedLaterNotAtOnce) {
  boost::asio::io_context io;
  std::unique_ptr<MetricsServer> server = StartServer(io);
  ASSERT_NE(server, nullptr);
  UniqueFd client = Connect(server->port());
  Send(client.get(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  {
    NoFdsLeft no_fds;
    const milliseconds cpu = ThreadCpuTime();
    io.run_for(milliseconds(500));
    EXPECT_LT(ThreadCpuTime() - cpu, milliseconds(100)) << "the accept loop spins";
  }
  io.run_for(3 * MetricsServer::kAcceptRetry);
  bool closed = false;
  const std::string answer = Received(client.get(), &closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  EXPECT_NE(answer.find("\r\n\r\nup 1\n"), std::string::npos) << answer;
}

// Each connection may be held 5 s: past kMaxSessions at once a new one is closed at once, so
// that a client opening many cannot take every fd the controller has; once one ends, the
// next is served.
TEST(MetricsServer, ConnectionsPastTheCapAreClosedAtOnce) {
  boost::asio::io_context io;
  std::unique_ptr<MetricsServer> server = StartServer(io);
  ASSERT_NE(server, nullptr);
  std::vector<UniqueFd> idle;
  for (size_t i = 0; i < MetricsServer::kMaxSessions; ++i) {
    idle.push_back(Connect(server->port()));
    io.run_for(milliseconds(2));  // accepted (the backlog is short)
  }
  io.run_for(milliseconds(100));
  bool closed = false;
  for (const UniqueFd& fd : idle) {
    EXPECT_EQ(Received(fd.get(), &closed), "");
    ASSERT_FALSE(closed) << "a connection under the cap is served";
  }
  UniqueFd over = Connect(server->port());
  io.run_for(milliseconds(100));
  EXPECT_EQ(Received(over.get(), &closed), "");
  EXPECT_TRUE(closed) << "a connection over the cap is closed at once";

  idle.pop_back();  // that session ends
  io.run_for(milliseconds(100));
  UniqueFd next = Connect(server->port());
  Send(next.get(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  io.run_for(milliseconds(100));
  const std::string answer = Received(next.get(), &closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
}

// A HEAD answer carries no body (a client reads none, and would take it for the next answer);
// other methods get a 405 that says which are served.
TEST(MetricsServer, HeadGetsTheHeadersAlone) {
  boost::asio::io_context io;
  std::unique_ptr<MetricsServer> server = StartServer(io);
  ASSERT_NE(server, nullptr);
  const auto ask = [&](const std::string& request) {
    UniqueFd client = Connect(server->port());
    Send(client.get(), request);
    io.run_for(milliseconds(100));
    bool closed = false;
    return Received(client.get(), &closed);
  };
  std::string answer = ask("HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  EXPECT_NE(answer.find("Content-Length: 5\r\n"), std::string::npos) << answer;
  EXPECT_EQ(answer.substr(answer.find("\r\n\r\n") + 4), "") << answer;
  answer = ask("HEAD /other HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 404", 0), 0u) << answer;
  EXPECT_EQ(answer.substr(answer.find("\r\n\r\n") + 4), "") << answer;
  answer = ask("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 405", 0), 0u) << answer;
  EXPECT_NE(answer.find("Allow: GET, HEAD\r\n"), std::string::npos) << answer;
  EXPECT_NE(answer.find("only GET /metrics is served"), std::string::npos) << answer;
}

}  // namespace
}  // namespace baton
