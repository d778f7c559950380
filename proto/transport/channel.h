// Channel: one connected Unix stream socket carrying frames, each with its file descriptors.
//
// A frame and its fds leave in one sendmsg (SCM_RIGHTS). On receipt, every batch of fds is
// tied to the byte of the stream it arrived with, so a completed frame takes exactly the fds
// that came inside it: fewer or more than its fd_count, a truncated control message, or any
// malformed frame is a protocol error. A protocol error closes this connection only: the
// reason is logged, sent to the peer in a best-effort ErrorMsg, and returned; the process
// and its other connections carry on.
//
// The socket is a Boost.Asio local stream socket in non-blocking mode. Receive() blocks (with
// an optional timeout); AsyncReceive() completes on the socket's io_context. Send() writes the
// whole frame before returning, waiting for the socket to drain for at most send_timeout.
// In queued mode (max_queued_send_bytes > 0, for a daemon's single io thread) Send() never
// waits: what the socket does not take at once is queued, fds included, and written on the
// io_context as the peer reads. A peer that takes nothing for send_timeout while bytes are
// queued is cut off (by a timer, or by the next Send(), which fails); so is one whose backlog
// behind the frame being written would pass max_queued_send_bytes. A pending AsyncReceive
// then completes with Unavailable. Close() and the destructor give queued frames one more
// non-blocking chance to leave.
// A Channel owns its socket and every fd received and not yet handed out. It is used by one
// thread at a time (the io_context thread of its owner); it must not be moved while an
// AsyncReceive is pending, nor in queued mode while frames are queued (queued_send_bytes()
// > 0: a write wait and a timer refer to it). Destroying it drops a pending AsyncReceive
// without calling it.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/io/unique_fd.h"
#include "base/status.h"
#include "proto/messages.h"
#include "proto/transport/send_budget.h"
#include "proto/wire/frame.h"

namespace baton::proto {

// One message taken off a channel, with the fds that came with it (in the order sent).
struct ReceivedMessage {
  MsgType type{};
  std::string payload;
  std::vector<UniqueFd> fds;

  // Decodes the payload as a T. A different type is FailedPrecondition, except that an
  // ErrorMsg from the peer returns the error it carries.
  template <typename T>
  Result<T> As() const {
    if (type == T::kType) return Decode<T>(payload);
    if (type == MsgType::kErrorMsg) {
      Result<ErrorMsg> error = Decode<ErrorMsg>(payload);
      if (!error.ok()) return error.status();
      return error->ToStatus().WithContext("peer reported an error");
    }
    return FailedPrecondition("expected " + MsgTypeName(T::kType) + ", got " + MsgTypeName(type));
  }
};

struct ChannelOptions {
  size_t max_frame_size = kDefaultMaxFrameSize;       // the largest frame received
  size_t max_send_frame_size = kDefaultMaxFrameSize;  // the largest frame sent
  Duration send_timeout = std::chrono::seconds(5);
  size_t max_queued_send_bytes = 0;  // > 0: queued mode (see above); the backlog limit
  // Queued mode: a limit shared with other channels on what they queue together (may be
  // null: none); see send_budget.h.
  std::shared_ptr<SendBudget> send_budget = nullptr;
  std::string label = "unix peer";  // names the connection in logs and errors
  Clock* clock = nullptr;           // for timeouts; RealClock when null
};

// The credentials of the process at the other end, as the kernel saw them at connect time.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

class Channel {
 public:
  using Socket = boost::asio::local::stream_protocol::socket;
  using ReceiveHandler = std::function<void(Result<ReceivedMessage>)>;

  // Takes a connected socket and makes it non-blocking.
  explicit Channel(Socket socket, ChannelOptions options = {});
  ~Channel();
  Channel(Channel&& other) noexcept;
  Channel& operator=(Channel&& other) noexcept;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Two connected channels (socketpair), for tests and in-process peers.
  static Result<std::pair<Channel, Channel>> Pair(boost::asio::io_context& io,
                                                  ChannelOptions options = {});

  template <typename T>
  Status Send(const T& msg, std::span<const int> fds = {}) {
    Result<std::string> payload = Encode(msg);
    if (!payload.ok()) return payload.status();
    return SendFrame(T::kType, *payload, fds);
  }
  // Sends one frame carrying `fds` (the caller keeps its fds; the peer gets duplicates).
  Status SendFrame(MsgType type, std::string_view payload, std::span<const int> fds = {});

  // The next message, waiting at most `timeout` (forever when nullopt). DeadlineExceeded
  // leaves the channel open; every other error closes it.
  Result<ReceivedMessage> Receive(std::optional<Duration> timeout = std::nullopt);
  // The next message if one can be had without blocking, nullopt if not yet.
  Result<std::optional<ReceivedMessage>> TryReceive();
  // Calls `handler` on the io_context with the next message or the error that closed the
  // channel. One AsyncReceive at a time; issue the next from the handler.
  void AsyncReceive(ReceiveHandler handler);

  // Logs `reason`, tells the peer with a best-effort ErrorMsg, and closes.
  void CloseWithError(const Status& reason);
  // Closes the socket; a pending AsyncReceive completes with Unavailable.
  void Close();

  bool is_open() const { return socket_.is_open(); }
  // Whether bytes have come that no receive has returned yet: in this channel's buffer, or
  // still in the socket.
  bool HasUnread();
  int native_handle() { return socket_.native_handle(); }
  const std::string& label() const { return options_.label; }
  void set_label(std::string label) { options_.label = std::move(label); }
  // Queued mode: bytes accepted by Send() that the peer has not taken yet.
  size_t queued_send_bytes() const { return out_bytes_; }
  // Moves what this channel has queued from its send budget to `budget` (null: none), and
  // takes later sends from it.
  void SetSendBudget(std::shared_ptr<SendBudget> budget);
  // The protocol version agreed by Hello (0 before).
  uint16_t version() const { return version_; }
  void set_version(uint16_t version) { version_ = version; }
  Result<PeerCredentials> peer_credentials();
  // A pidfd of the process that connected (SO_PEERPIDFD, Linux 6.5): it names that process
  // even once its pid is given to another. Unimplemented on an older kernel.
  Result<UniqueFd> peer_pidfd();

 private:
  // Fds that arrived with the stream bytes ending at `end_offset`.
  struct FdBatch {
    uint64_t end_offset = 0;
    std::vector<UniqueFd> fds;
  };
  enum class ReadOutcome { kData, kWouldBlock, kEof };
  // A frame accepted in queued mode; its fds leave with its first byte.
  struct OutFrame {
    std::string bytes;
    size_t sent = 0;
    std::vector<UniqueFd> fds;
  };

  Status SendBytes(std::string_view bytes, std::span<const int> fds);
  // One sendmsg (retried on EINTR): bytes the kernel took, 0 when it would block. An error
  // closes the channel.
  Result<size_t> SendSome(std::string_view bytes, std::span<const int> fds);
  Status SendQueued(std::string frame, std::span<const int> fds);
  // Writes queued frames until the socket would block; false if that failed (then closed).
  bool FlushQueue();
  // Forgets the send queue and gives its bytes back to the send budget.
  void DropQueue();
  void ArmWriteWait();
  // Cuts off a peer that took nothing for send_timeout while frames are queued.
  void ArmStallTimer();
  Result<ReadOutcome> ReadSome();
  Result<std::optional<ReceivedMessage>> TakeFrame();
  Status OnEof();
  Status ProtocolError(Status status);
  Status WaitFor(short events, std::optional<TimePoint> deadline);
  TimePoint Now() const;

  Socket socket_;
  ChannelOptions options_;
  FrameDecoder decoder_;
  uint64_t received_ = 0;  // stream bytes fed to the decoder
  std::deque<FdBatch> fd_batches_;
  size_t pending_fds_ = 0;
  uint16_t version_ = 0;
  std::string closed_reason_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::vector<char> recv_buf_;
  std::deque<OutFrame> out_queue_;
  size_t out_bytes_ = 0;
  TimePoint out_progress_{};  // when the peer last took queued bytes (or the queue began)
  bool write_wait_armed_ = false;
  bool stall_timer_armed_ = false;
  std::unique_ptr<boost::asio::steady_timer> stall_timer_;
};

}  // namespace baton::proto
