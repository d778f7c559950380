#include "proto/transport/listener.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "base/io/unique_fd.h"
#include "base/log.h"

namespace baton::proto {
namespace {

using Endpoint = boost::asio::local::stream_protocol::endpoint;

Status CheckPathLength(const std::string& path) {
  if (path.empty()) return InvalidArgument("empty Unix socket path");
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("Unix socket path '" + path + "' is " + std::to_string(path.size()) +
                           " bytes; the limit is " +
                           std::to_string(sizeof(sockaddr_un::sun_path) - 1));
  }
  return OkStatus();
}

// Sets how long a blocking send, and a connect(2) on AF_UNIX, may wait (0: forever).
Status SetSendTimeout(int fd, Duration timeout) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  const timeval tv{.tv_sec = us / 1'000'000, .tv_usec = us % 1'000'000};
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return ErrnoStatus("setsockopt SO_SNDTIMEO", errno);
  }
  return OkStatus();
}

// connect(2) of the blocking socket `fd` to `path`. A listener that accepts nothing (a frozen
// process) and whose backlog is full makes connect wait for room, forever unless `timeout`
// bounds it: on AF_UNIX the wait honours SO_SNDTIMEO and fails with EAGAIN past it (a
// non-blocking connect fails at once with EAGAIN instead, and poll cannot tell when room
// comes).
Status ConnectWithin(int fd, const std::string& path, std::optional<Duration> timeout) {
  const Endpoint endpoint(path);
  const auto deadline = std::chrono::steady_clock::now() + timeout.value_or(Duration::zero());
  for (;;) {
    if (timeout.has_value()) {
      const Duration left = deadline - std::chrono::steady_clock::now();
      if (left <= Duration::zero()) break;
      // At least 1 us: a zero SO_SNDTIMEO means no bound at all.
      BATON_RETURN_IF_ERROR(
          SetSendTimeout(fd, std::max<Duration>(left, std::chrono::microseconds(1))));
    }
    if (::connect(fd, endpoint.data(), static_cast<socklen_t>(endpoint.size())) == 0) {
      return timeout.has_value() ? SetSendTimeout(fd, Duration::zero()) : OkStatus();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN && timeout.has_value()) break;
    return Unavailable("connect to " + path + ": " + std::strerror(errno));
  }
  return DeadlineExceeded(
      "connect to " + path + ": no room in its backlog within " +
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(*timeout).count()) +
      " ms (the process listening there accepts nothing)");
}

// Removes a socket left at `path` by a process that is gone; refuses to touch a live one or
// anything that is not a socket.
Status ClearStaleSocket(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoStatus("stat of socket path " + path, errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return FailedPrecondition("'" + path + "' exists and is not a socket; not replacing it");
  }
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!probe.valid()) return ErrnoStatus("socket", errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    return Status(StatusCode::kAlreadyExists, "another process is listening on '" + path + "'");
  }
  if (errno != ECONNREFUSED) return ErrnoStatus("probing existing socket " + path, errno);
  BATON_LOG(INFO, "proto") << "removing stale socket " << path;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus("unlink of stale socket " + path, errno);
  }
  return OkStatus();
}

Status AsioStatus(const std::string& what, const boost::system::error_code& ec) {
  return Status(StatusCode::kIoError, what + ": " + ec.message());
}

// Wraps an accepted socket, labelled with the peer's pid.
Channel MakeAccepted(Channel::Socket socket, ChannelOptions options) {
  Channel channel(std::move(socket), options);
  Result<PeerCredentials> cred = channel.peer_credentials();
  if (cred.ok()) channel.set_label(options.label + " pid " + std::to_string(cred->pid));
  return channel;
}

}  // namespace

Listener::Listener(Acceptor acceptor, std::string path, ChannelOptions options)
    : acceptor_(std::move(acceptor)), path_(std::move(path)), options_(std::move(options)) {}

Listener::~Listener() { Close(); }

Listener::Listener(Listener&& other) noexcept
    : acceptor_(std::move(other.acceptor_)),
      path_(std::exchange(other.path_, std::string())),
      options_(std::move(other.options_)),
      alive_(std::move(other.alive_)) {}

Listener& Listener::operator=(Listener&& other) noexcept {
  if (this != &other) {
    Close();
    acceptor_ = std::move(other.acceptor_);
    path_ = std::exchange(other.path_, std::string());
    options_ = std::move(other.options_);
    alive_ = std::move(other.alive_);
  }
  return *this;
}

Result<Listener> Listener::Bind(boost::asio::io_context& io, const std::string& path,
                                ChannelOptions options, mode_t mode) {
  BATON_RETURN_IF_ERROR(CheckPathLength(path));
  BATON_RETURN_IF_ERROR(ClearStaleSocket(path));
  try {
    return BindChecked(io, path, std::move(options), mode);
  } catch (const boost::system::system_error& e) {
    return Status(StatusCode::kResourceExhausted, "listening on " + path + ": " + e.what());
  }
}

Result<Listener> Listener::BindChecked(boost::asio::io_context& io, const std::string& path,
                                       ChannelOptions options, mode_t mode) {
  Acceptor acceptor(io);
  boost::system::error_code ec;
  acceptor.open(boost::asio::local::stream_protocol(), ec);
  if (ec) return AsioStatus("socket for " + path, ec);
  if (!SetCloseOnExec(acceptor.native_handle())) return ErrnoStatus("FD_CLOEXEC on " + path, errno);
  acceptor.bind(Endpoint(path), ec);
  if (ec) return AsioStatus("bind " + path, ec);
  // Permissions are set before listen(), so nobody can connect in between.
  if (::chmod(path.c_str(), mode) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return ErrnoStatus("chmod " + path, err);
  }
  acceptor.listen(boost::asio::socket_base::max_listen_connections, ec);
  if (!ec) acceptor.non_blocking(true, ec);
  if (ec) {
    ::unlink(path.c_str());
    return AsioStatus("listen on " + path, ec);
  }
  BATON_LOG(INFO, "proto") << "listening on " << path;
  return Listener(std::move(acceptor), path, std::move(options));
}

Result<Channel> Listener::Accept(std::optional<Duration> timeout) {
  Clock& clock = options_.clock != nullptr ? *options_.clock : RealClock::Get();
  std::optional<TimePoint> deadline;
  if (timeout.has_value()) deadline = clock.Now() + *timeout;
  while (true) {
    if (!acceptor_.is_open()) return Unavailable("listener on " + path_ + " is closed");
    Channel::Socket socket(acceptor_.get_executor());
    boost::system::error_code ec;
    acceptor_.accept(socket, ec);
    if (!ec) return MakeAccepted(std::move(socket), options_);
    if (ec != boost::asio::error::would_block && ec != boost::asio::error::try_again &&
        ec != boost::asio::error::interrupted && ec != boost::asio::error::connection_aborted) {
      return AsioStatus("accept on " + path_, ec);
    }
    int timeout_ms = -1;
    if (deadline.has_value()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - clock.Now());
      if (left.count() <= 0) return DeadlineExceeded("no connection on " + path_ + " in time");
      timeout_ms = static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX));
    }
    pollfd pfd{.fd = acceptor_.native_handle(), .events = POLLIN, .revents = 0};
    if (::poll(&pfd, 1, timeout_ms) < 0 && errno != EINTR) {
      return ErrnoStatus("poll on listener " + path_, errno);
    }
  }
}

void Listener::AsyncAccept(AcceptHandler handler) {
  std::weak_ptr<bool> alive = alive_;
  acceptor_.async_accept([alive, options = options_, path = path_, handler = std::move(handler)](
                             const boost::system::error_code& ec, Channel::Socket socket) {
    if (alive.expired()) return;
    if (ec) {
      handler(AsioStatus("accept on " + path, ec));
      return;
    }
    handler(MakeAccepted(std::move(socket), options));
  });
}

void Listener::Close() {
  boost::system::error_code ec;
  acceptor_.cancel(ec);
  acceptor_.close(ec);
  if (!path_.empty()) {
    ::unlink(path_.c_str());
    path_.clear();
  }
}

Result<Channel> Connect(boost::asio::io_context& io, const std::string& path,
                        ChannelOptions options, std::optional<Duration> timeout) {
  BATON_RETURN_IF_ERROR(CheckPathLength(path));
  try {
    Channel::Socket socket(io);  // the first socket of `io` makes its reactor: may throw
    boost::system::error_code ec;
    socket.open(boost::asio::local::stream_protocol(), ec);
    if (ec) return Unavailable("connect to " + path + ": " + ec.message());
    BATON_RETURN_IF_ERROR(ConnectWithin(socket.native_handle(), path, timeout));
    return Channel(std::move(socket), std::move(options));
  } catch (const boost::system::system_error& e) {
    return Status(StatusCode::kResourceExhausted, "connect to " + path + ": " + e.what());
  }
}

}  // namespace baton::proto
