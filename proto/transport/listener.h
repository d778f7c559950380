// Listener and Connect: the two ends of establishing a Channel over a Unix socket path.
//
// Listener binds a filesystem socket (mode 0600 unless told otherwise), refusing to take over
// a path where another process is still listening and removing a stale socket left by a dead
// one. It unlinks its path when destroyed or closed. Accepted channels are labelled with the
// peer's pid. Accept() blocks (with an optional timeout); AsyncAccept() completes on the
// io_context. Thread-compatible: used from its owner's io_context thread.
#pragma once

#include <sys/stat.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "proto/transport/channel.h"

namespace baton::proto {

class Listener {
 public:
  using Acceptor = boost::asio::local::stream_protocol::acceptor;
  using AcceptHandler = std::function<void(Result<Channel>)>;

  // Binds and listens on `path`. `options` is the template for accepted channels.
  static Result<Listener> Bind(boost::asio::io_context& io, const std::string& path,
                               ChannelOptions options = {}, mode_t mode = 0600);

  ~Listener();
  Listener(Listener&& other) noexcept;
  Listener& operator=(Listener&& other) noexcept;
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // The next connection, waiting at most `timeout` (forever when nullopt).
  Result<Channel> Accept(std::optional<Duration> timeout = std::nullopt);
  // Calls `handler` on the io_context with the next connection or the error. The handler is
  // dropped without a call if the Listener is destroyed first.
  void AsyncAccept(AcceptHandler handler);

  // Stops listening and removes the socket path.
  void Close();
  const std::string& path() const { return path_; }
  bool is_open() const { return acceptor_.is_open(); }

 private:
  Listener(Acceptor acceptor, std::string path, ChannelOptions options);
  // Bind's work after the path checks; may throw Asio's system_error (no reactor).
  static Result<Listener> BindChecked(boost::asio::io_context& io, const std::string& path,
                                      ChannelOptions options, mode_t mode);

  Acceptor acceptor_;
  std::string path_;
  ChannelOptions options_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// Connects to the listener at `path`; the channel is labelled `options.label`. A listener
// whose backlog is full (a process that accepts nothing) is waited for at most `timeout`
// (forever when nullopt), then DeadlineExceeded. Unavailable when nothing listens there.
Result<Channel> Connect(boost::asio::io_context& io, const std::string& path,
                        ChannelOptions options = {},
                        std::optional<Duration> timeout = std::nullopt);

}  // namespace baton::proto
