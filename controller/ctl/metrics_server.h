// MetricsServer: the controller's optional Prometheus endpoint, a small Boost.Beast HTTP/1.1
// server answering GET /metrics with the text a callback produces (404 for other paths, 405
// for other methods). One request per connection; requests over 8 KiB or slower than 5 s are
// dropped.
//
// Ownership: the controller's main owns it; the callback must outlive it. Thread: the
// controller's io_context thread (the callback runs there, so it may read controller state).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
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

 private:
  MetricsServer(boost::asio::io_context& io, Render render);
  void Accept();

  boost::asio::ip::tcp::acceptor acceptor_;
  Render render_;
  int port_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace baton
