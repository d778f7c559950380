// MetricsServer: the controller's optional Prometheus endpoint, a small Boost.Beast HTTP/1.1
// server answering GET /metrics with the text a callback produces (404 for other paths, 405
// for other methods; HEAD gets GET's headers alone). One request per connection;
// requests over 8 KiB or slower than 5 s are dropped. At most kMaxSessions connections are
// served at once: past it a new one is closed at once, so that a client opening many cannot
// take every fd the controller has. An accept that fails (out of fds) is retried after
// kAcceptRetry, not at once: the connection stays queued and the retry would fail again.
//
// Ownership: the controller's main owns it; the callback must outlive it. Thread: the
// controller's io_context thread (the callback runs there, so it may read controller state).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"

namespace baton {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;

  static Result<std::unique_ptr<MetricsServer>> Start(boost::asio::io_context& io,
                                                      const std::string& host, int port,
                                                      Render render);
  ~MetricsServer();
  int port() const { return port_; }

  static constexpr size_t kMaxSessions = 64;
  static constexpr std::chrono::milliseconds kAcceptRetry{100};

 private:
  MetricsServer(boost::asio::io_context& io, Render render);
  void Accept();
  void OnAccepted(boost::asio::ip::tcp::socket socket);
  void RetryAccept(const boost::system::error_code& ec);

  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer accept_retry_;
  Render render_;
  int port_ = 0;
  uint64_t failed_accepts_ = 0;  // in a row; said once
  uint64_t refused_ = 0;         // over kMaxSessions in a row; said once
  // Connections being served; each holds the count and takes itself off when it ends, also
  // past this server's end.
  std::shared_ptr<size_t> sessions_ = std::make_shared<size_t>(0);
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace baton
