#include "proto/transport/channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "base/io/unique_fd.h"
#include "base/log.h"

namespace baton::proto {
namespace {

constexpr size_t kRecvChunk = 64 * 1024;
constexpr size_t kFdControlSpace = CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame);

std::string MillisText(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

FrameDecoderOptions DecoderOptions(const ChannelOptions& options) {
  FrameDecoderOptions decoder;
  decoder.max_frame_size = options.max_frame_size;
  decoder.is_known_type = IsKnownMsgType;
  return decoder;
}

}  // namespace

Channel::Channel(Socket socket, ChannelOptions options)
    : socket_(std::move(socket)),
      options_(std::move(options)),
      decoder_(DecoderOptions(options_)),
      recv_buf_(kRecvChunk) {
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);
  if (!ec && socket_.is_open() && !SetCloseOnExec(socket_.native_handle())) {
    ec = boost::system::error_code(errno, boost::system::system_category());
  }
  if (ec) {
    BATON_LOG(WARN, "proto") << options_.label
                             << ": cannot make socket non-blocking and close-on-exec: "
                             << ec.message();
    socket_.close(ec);
    closed_reason_ = "socket could not be made non-blocking and close-on-exec";
  }
}

Channel::~Channel() {
  if (socket_.is_open() && !out_queue_.empty()) (void)FlushQueue();
  if (options_.send_budget != nullptr) options_.send_budget->Give(out_bytes_);
}

void Channel::SetSendBudget(std::shared_ptr<SendBudget> budget) {
  if (options_.send_budget != nullptr) options_.send_budget->Give(out_bytes_);
  options_.send_budget = std::move(budget);
  if (options_.send_budget != nullptr) (void)options_.send_budget->TryTake(out_bytes_);
}

void Channel::DropQueue() {
  if (options_.send_budget != nullptr) options_.send_budget->Give(out_bytes_);
  out_queue_.clear();
  out_bytes_ = 0;
}
Channel::Channel(Channel&& other) noexcept = default;
Channel& Channel::operator=(Channel&& other) noexcept = default;

Result<std::pair<Channel, Channel>> Channel::Pair(boost::asio::io_context& io,
                                                  ChannelOptions options) {
  try {
    Socket a(io), b(io);
    boost::system::error_code ec;
    boost::asio::local::connect_pair(a, b, ec);
    if (ec) return Status(StatusCode::kIoError, "socketpair: " + ec.message());
    ChannelOptions oa = options, ob = options;
    oa.label = options.label + " (a)";
    ob.label = options.label + " (b)";
    return std::make_pair(Channel(std::move(a), oa), Channel(std::move(b), ob));
  } catch (const boost::system::system_error& e) {
    return Status(StatusCode::kResourceExhausted, std::string("socketpair: ") + e.what());
  }
}

TimePoint Channel::Now() const {
  return options_.clock != nullptr ? options_.clock->Now() : RealClock::Get().Now();
}

Status Channel::WaitFor(short events, std::optional<TimePoint> deadline) {
  while (true) {
    int timeout_ms = -1;
    if (deadline.has_value()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Now());
      if (left.count() <= 0) return DeadlineExceeded("timed out");
      timeout_ms = static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX));
    }
    pollfd pfd{.fd = socket_.native_handle(), .events = events, .revents = 0};
    const int n = ::poll(&pfd, 1, timeout_ms);
    if (n > 0) return OkStatus();  // readable, writable, or an error/hangup the I/O call reports
    if (n < 0 && errno != EINTR) return ErrnoStatus("poll on " + options_.label, errno);
  }
}

Status Channel::SendFrame(MsgType type, std::string_view payload, std::span<const int> fds) {
  if (!is_open()) return Unavailable(options_.label + ": channel closed " + closed_reason_);
  BATON_ASSIGN_OR_RETURN(std::string frame, EncodeFrame(static_cast<uint16_t>(type), payload,
                                                        fds.size(), options_.max_send_frame_size));
  Status sent = options_.max_queued_send_bytes > 0 ? SendQueued(std::move(frame), fds)
                                                   : SendBytes(frame, fds);
  return sent.WithContext("sending " + MsgTypeName(type) + " to " + options_.label);
}

Result<size_t> Channel::SendSome(std::string_view bytes, std::span<const int> fds) {
  alignas(cmsghdr) char control[kFdControlSpace];
  iovec iov{.iov_base = const_cast<char*>(bytes.data()), .iov_len = bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  while (true) {
    // The kernel attaches the fds to the first bytes it takes.
    const ssize_t n = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return size_t{0};
    // Emptied first: Close() flushes the queue, which would call this again.
    DropQueue();
    Close();
    if (err == EPIPE || err == ECONNRESET) {
      closed_reason_ = "by the peer";
      return Unavailable("peer closed the connection");
    }
    closed_reason_ = "after a send error";
    return ErrnoStatus("sendmsg", err);
  }
}

Status Channel::SendBytes(std::string_view bytes, std::span<const int> fds) {
  const TimePoint deadline = Now() + options_.send_timeout;
  size_t sent = 0;
  while (sent < bytes.size()) {
    BATON_ASSIGN_OR_RETURN(size_t n,
                           SendSome(bytes.substr(sent), sent == 0 ? fds : std::span<const int>()));
    sent += n;
    if (n > 0) continue;
    Status waited = WaitFor(POLLOUT, deadline);
    if (waited.ok()) continue;
    if (sent == 0 && waited.code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceeded("peer did not read for " + MillisText(options_.send_timeout));
    }
    // Part of a frame is out: the stream can no longer be continued.
    Close();
    closed_reason_ = "after a partial send";
    return waited.code() == StatusCode::kDeadlineExceeded
               ? DeadlineExceeded("peer stopped reading mid-frame for " +
                                  MillisText(options_.send_timeout) + "; connection closed")
               : waited;
  }
  return OkStatus();
}

Status Channel::SendQueued(std::string frame, std::span<const int> fds) {
  if (!FlushQueue()) return Unavailable("channel closed " + closed_reason_);
  size_t sent = 0;
  if (out_queue_.empty()) {
    while (sent < frame.size()) {
      BATON_ASSIGN_OR_RETURN(size_t n, SendSome(std::string_view(frame).substr(sent),
                                                sent == 0 ? fds : std::span<const int>()));
      if (n == 0) break;
      sent += n;
    }
    if (sent == frame.size()) return OkStatus();
    out_progress_ = Now();
  } else if (Now() - out_progress_ >= options_.send_timeout) {
    const size_t queued = out_bytes_;
    Close();
    closed_reason_ = "after the peer stopped reading";
    return DeadlineExceeded("peer took nothing for " + MillisText(options_.send_timeout) +
                            " with " + std::to_string(queued) + " bytes queued; connection closed");
  } else if (out_bytes_ - (out_queue_.front().bytes.size() - out_queue_.front().sent) +
                 frame.size() >
             options_.max_queued_send_bytes) {
    const size_t queued = out_bytes_;
    Close();
    closed_reason_ = "after the peer fell too far behind";
    return ResourceExhausted("peer is " + std::to_string(queued) + " bytes behind (limit " +
                             std::to_string(options_.max_queued_send_bytes) +
                             "); connection closed");
  }
  // The fds are copied before the budget is taken, so that a failed copy (EMFILE) leaves
  // the shared budget as it was.
  std::vector<UniqueFd> fd_copies;
  if (sent == 0) {
    for (int fd : fds) {
      const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (copy < 0) return ErrnoStatus("dup of an fd to send", errno);
      fd_copies.emplace_back(copy);
    }
  }
  const std::shared_ptr<SendBudget>& budget = options_.send_budget;
  if (budget != nullptr && !budget->TryTake(frame.size() - sent)) {
    const size_t shared = budget->used();
    const size_t mine = out_bytes_;
    const size_t limit = budget->limit();
    Close();
    closed_reason_ = "after the peers together fell too far behind";
    return ResourceExhausted("the connections of this daemon hold " + std::to_string(shared) +
                             " bytes unsent together (limit " + std::to_string(limit) +
                             "); this one, " + std::to_string(mine) + " bytes behind, closed");
  }
  OutFrame out{.bytes = std::move(frame), .sent = sent, .fds = std::move(fd_copies)};
  out_bytes_ += out.bytes.size() - sent;
  out_queue_.push_back(std::move(out));
  ArmWriteWait();
  ArmStallTimer();
  return OkStatus();
}

void Channel::ArmStallTimer() {
  if (stall_timer_armed_ || !is_open()) return;
  if (stall_timer_ == nullptr) {
    stall_timer_ = std::make_unique<boost::asio::steady_timer>(socket_.get_executor());
  }
  stall_timer_armed_ = true;
  stall_timer_->expires_after(options_.send_timeout);
  std::weak_ptr<bool> alive = alive_;
  stall_timer_->async_wait([this, alive](const boost::system::error_code& ec) {
    if (alive.expired()) return;
    stall_timer_armed_ = false;
    if (ec || !is_open() || out_queue_.empty()) return;
    if (Now() - out_progress_ < options_.send_timeout) return ArmStallTimer();
    BATON_LOG(WARN, "proto") << "closing connection to " << options_.label << ": peer took "
                             << "nothing for " << MillisText(options_.send_timeout) << " with "
                             << out_bytes_ << " bytes queued";
    Close();
    closed_reason_ = "after the peer stopped reading";
  });
}

bool Channel::FlushQueue() {
  while (!out_queue_.empty()) {
    OutFrame& f = out_queue_.front();
    std::vector<int> raw;
    if (f.sent == 0) {
      for (const UniqueFd& fd : f.fds) raw.push_back(fd.get());
    }
    Result<size_t> n = SendSome(std::string_view(f.bytes).substr(f.sent), raw);
    if (!n.ok()) return false;  // closed
    if (*n == 0) return true;
    f.sent += *n;
    f.fds.clear();
    out_bytes_ -= *n;
    if (options_.send_budget != nullptr) options_.send_budget->Give(*n);
    out_progress_ = Now();
    if (f.sent == f.bytes.size()) out_queue_.pop_front();
  }
  return true;
}

void Channel::ArmWriteWait() {
  if (write_wait_armed_ || !is_open()) return;
  write_wait_armed_ = true;
  std::weak_ptr<bool> alive = alive_;
  socket_.async_wait(Socket::wait_write, [this, alive](const boost::system::error_code& ec) {
    if (alive.expired()) return;
    write_wait_armed_ = false;
    if (ec || !is_open()) return;
    // A failed write closes the channel; a pending AsyncReceive then reports it.
    if (FlushQueue() && !out_queue_.empty()) ArmWriteWait();
  });
}

Result<Channel::ReadOutcome> Channel::ReadSome() {
  alignas(cmsghdr) char control[kFdControlSpace];
  iovec iov{.iov_base = recv_buf_.data(), .iov_len = recv_buf_.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(socket_.native_handle(), &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return ReadOutcome::kWouldBlock;
    Close();
    if (err == ECONNRESET) {
      closed_reason_ = "by the peer";
      return Unavailable(options_.label + ": peer reset the connection");
    }
    closed_reason_ = "after a receive error";
    return ErrnoStatus("recvmsg from " + options_.label, err);
  }
  // Take ownership of every fd first, so that an error below closes them all.
  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return ProtocolError(InvalidArgument(
        "file descriptors truncated (MSG_CTRUNC): the peer sent more than " +
        std::to_string(kMaxFdsPerFrame) + " at once, or this process is out of fds"));
  }
  if (n == 0) return ReadOutcome::kEof;
  received_ += static_cast<uint64_t>(n);
  decoder_.Feed(std::string_view(recv_buf_.data(), static_cast<size_t>(n)));
  if (!fds.empty()) {
    pending_fds_ += fds.size();
    fd_batches_.push_back(FdBatch{.end_offset = received_, .fds = std::move(fds)});
    if (pending_fds_ > kMaxFdsPerFrame) {
      return ProtocolError(InvalidArgument(std::to_string(pending_fds_) +
                                           " fds arrived for one frame, more than the limit of " +
                                           std::to_string(kMaxFdsPerFrame)));
    }
  }
  return ReadOutcome::kData;
}

Result<std::optional<ReceivedMessage>> Channel::TakeFrame() {
  Result<std::optional<Frame>> next = decoder_.Next();
  if (!next.ok()) return ProtocolError(next.status());
  if (!next->has_value()) return std::optional<ReceivedMessage>();
  Frame& frame = **next;
  ReceivedMessage msg;
  msg.type = static_cast<MsgType>(frame.type);
  msg.payload = std::move(frame.payload);
  // The fds of this frame arrived with a byte inside it: every batch that ended by its end.
  const uint64_t frame_end = decoder_.consumed();
  while (!fd_batches_.empty() && fd_batches_.front().end_offset <= frame_end) {
    for (UniqueFd& fd : fd_batches_.front().fds) msg.fds.push_back(std::move(fd));
    fd_batches_.pop_front();
  }
  pending_fds_ -= msg.fds.size();
  if (msg.fds.size() != frame.fd_count) {
    return ProtocolError(InvalidArgument(MsgTypeName(frame.type) + " frame declares " +
                                         std::to_string(frame.fd_count) + " fds, " +
                                         std::to_string(msg.fds.size()) + " arrived"));
  }
  return std::optional<ReceivedMessage>(std::move(msg));
}

Status Channel::OnEof() {
  Status truncated = decoder_.Finish();
  if (!truncated.ok()) return ProtocolError(truncated);
  if (pending_fds_ != 0) {
    return ProtocolError(
        InvalidArgument(std::to_string(pending_fds_) + " fds arrived with no frame to carry them"));
  }
  Close();
  closed_reason_ = "by the peer";
  return Unavailable(options_.label + ": peer closed the connection");
}

Result<std::optional<ReceivedMessage>> Channel::TryReceive() {
  if (!is_open()) return Unavailable(options_.label + ": channel closed " + closed_reason_);
  while (true) {
    Result<std::optional<ReceivedMessage>> taken = TakeFrame();
    if (!taken.ok() || taken->has_value()) return taken;
    BATON_ASSIGN_OR_RETURN(ReadOutcome outcome, ReadSome());
    if (outcome == ReadOutcome::kWouldBlock) return std::optional<ReceivedMessage>();
    if (outcome == ReadOutcome::kEof) return OnEof();
  }
}

Result<ReceivedMessage> Channel::Receive(std::optional<Duration> timeout) {
  std::optional<TimePoint> deadline;
  if (timeout.has_value()) deadline = Now() + *timeout;
  while (true) {
    BATON_ASSIGN_OR_RETURN(std::optional<ReceivedMessage> msg, TryReceive());
    if (msg.has_value()) return std::move(*msg);
    Status waited = WaitFor(POLLIN, deadline);
    if (waited.code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceeded("no message from " + options_.label + " within " +
                              MillisText(*timeout));
    }
    BATON_RETURN_IF_ERROR(waited);
  }
}

bool Channel::HasUnread() {
  if (decoder_.buffered() > 0) return true;
  int n = 0;
  return is_open() && ::ioctl(socket_.native_handle(), FIONREAD, &n) == 0 && n > 0;
}

void Channel::AsyncReceive(ReceiveHandler handler) {
  Result<std::optional<ReceivedMessage>> now = TryReceive();
  if (!now.ok() || now->has_value()) {
    Result<ReceivedMessage> result = now.ok() ? Result<ReceivedMessage>(std::move(**now))
                                              : Result<ReceivedMessage>(now.status());
    boost::asio::post(socket_.get_executor(),
                      [handler = std::move(handler), result = std::move(result)]() mutable {
                        handler(std::move(result));
                      });
    return;
  }
  std::weak_ptr<bool> alive = alive_;
  socket_.async_wait(Socket::wait_read, [this, alive, handler = std::move(handler)](
                                            const boost::system::error_code& ec) mutable {
    if (alive.expired()) return;
    if (ec) {
      handler(Unavailable(options_.label + ": receive cancelled: " + ec.message()));
      return;
    }
    AsyncReceive(std::move(handler));
  });
}

Status Channel::ProtocolError(Status status) {
  CloseWithError(status);
  return status;
}

void Channel::CloseWithError(const Status& reason) {
  if (!is_open()) return;
  BATON_LOG(WARN, "proto") << "closing connection to " << options_.label << ": "
                           << reason.ToString();
  Result<std::string> payload = Encode(ErrorMsg::FromStatus(reason));
  // Queued frames go first; if some stay queued, the reason cannot follow them.
  if (payload.ok() && FlushQueue() && out_queue_.empty()) {
    Result<std::string> frame =
        EncodeFrame(static_cast<uint16_t>(MsgType::kErrorMsg), *payload, 0, kDefaultMaxFrameSize);
    // One attempt, never blocking: a peer that does not read does not get the reason.
    if (frame.ok()) {
      ssize_t unused = ::send(socket_.native_handle(), frame->data(), frame->size(),
                              MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)unused;
    }
  }
  Close();
  closed_reason_ = "after a protocol error: " + reason.message();
}

void Channel::Close() {
  if (closed_reason_.empty()) closed_reason_ = "by this side";
  // Queued frames get one more non-blocking chance (a reply or a Stop sent just before).
  if (socket_.is_open()) (void)FlushQueue();
  DropQueue();
  boost::system::error_code ec;
  socket_.cancel(ec);
  socket_.close(ec);
  if (stall_timer_ != nullptr) stall_timer_->cancel();
  fd_batches_.clear();
  pending_fds_ = 0;
}

Result<UniqueFd> Channel::peer_pidfd() {
#ifndef SO_PEERPIDFD
  constexpr int SO_PEERPIDFD = 77;  // asm-generic/socket.h, Linux 6.5
#endif
  int fd = -1;
  socklen_t len = sizeof(fd);
  if (::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERPIDFD, &fd, &len) != 0) {
    if (errno == ENOPROTOOPT) return Unimplemented("SO_PEERPIDFD needs Linux 6.5");
    return ErrnoStatus("getsockopt(SO_PEERPIDFD) on " + options_.label, errno);
  }
  return UniqueFd(fd);
}

Result<PeerCredentials> Channel::peer_credentials() {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus("getsockopt(SO_PEERCRED) on " + options_.label, errno);
  }
  return PeerCredentials{.pid = cred.pid, .uid = cred.uid, .gid = cred.gid};
}

}  // namespace baton::proto
