// Channel in queued mode: sends that never wait, the backlog and send-timeout limits, and the
// send budget shared by a daemon's connections.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <optional>
#include <string>

#include "base/clock.h"
#include "proto/transport/channel.h"
#include "proto/transport/send_budget.h"
#include "tests/proto/proto_test_util.h"

namespace baton::proto {
namespace {

using namespace std::chrono_literals;
using testing::Pipe;

// Queued mode (a daemon's io thread): sends never wait for the peer; what the socket does not
// take is queued, fds with it, and written on the io_context as the peer reads.
class QueuedChannelTest : public ::testing::Test {
 protected:
  void Open(size_t limit, Duration send_timeout = 1s) {
    auto pair = Channel::Pair(io_, ChannelOptions{.send_timeout = send_timeout,
                                                  .max_queued_send_bytes = limit,
                                                  .label = "queued",
                                                  .clock = &clock_});
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    a_.emplace(std::move(pair->first));
    b_.emplace(std::move(pair->second));
  }
  // Sends 256 KiB frames until one is queued (the socket is full); returns how many.
  int FillSocket() {
    for (int i = 0; i < 1000; ++i) {
      EXPECT_TRUE(a_->Send(Stop{.reason = Reason(i)}).ok());
      if (a_->queued_send_bytes() > 0) return i + 1;
    }
    ADD_FAILURE() << "the socket never filled";
    return 0;
  }
  static std::string Reason(int i) { return std::to_string(i) + std::string(256 << 10, 'x'); }

  boost::asio::io_context io_;
  FakeClock clock_;
  std::optional<Channel> a_, b_;
};

TEST_F(QueuedChannelTest, SendsNeverWaitAndArriveInOrderWithTheirFds) {
  Open(64 << 20);
  Pipe pipe;
  const int filled = FillSocket();
  ASSERT_GT(filled, 0);
  // The peer reads nothing yet: these are queued, one with an fd.
  ASSERT_TRUE(
      a_->Send(Stop{.reason = Reason(filled)}, std::vector<int>{pipe.write_end.get()}).ok());
  const int total = filled + 8;
  for (int i = filled + 1; i < total; ++i) ASSERT_TRUE(a_->Send(Stop{.reason = Reason(i)}).ok());
  EXPECT_GT(a_->queued_send_bytes(), size_t{7} << 18);
  pipe.write_end.Reset();  // the queue holds its own copy of the fd
  int received = 0;
  for (int spin = 0; spin < 100000 && received < total; ++spin) {
    io_.poll();  // the write wait flushes as the reader makes room
    io_.restart();
    Result<std::optional<ReceivedMessage>> msg = b_->TryReceive();
    ASSERT_TRUE(msg.ok()) << msg.status().ToString();
    if (!msg->has_value()) continue;
    Result<Stop> stop = (*msg)->As<Stop>();
    ASSERT_TRUE(stop.ok());
    EXPECT_EQ(stop->reason, Reason(received)) << "frame " << received << " out of order";
    if (received == filled) {
      ASSERT_EQ((*msg)->fds.size(), 1u);
      ASSERT_EQ(::write((*msg)->fds[0].get(), "k", 1), 1);
      char c = 0;
      EXPECT_EQ(::read(pipe.read_end.get(), &c, 1), 1);
      EXPECT_EQ(c, 'k');
    } else {
      EXPECT_TRUE((*msg)->fds.empty());
    }
    ++received;
  }
  EXPECT_EQ(received, total);
  EXPECT_EQ(a_->queued_send_bytes(), 0u);
}

TEST_F(QueuedChannelTest, APeerTooFarBehindIsDropped) {
  Open(1 << 20);
  ASSERT_GT(FillSocket(), 0);
  Status sent = OkStatus();
  for (int i = 0; i < 10 && sent.ok(); ++i) sent = a_->Send(Stop{.reason = Reason(i)});
  EXPECT_EQ(sent.code(), StatusCode::kResourceExhausted) << sent.ToString();
  EXPECT_FALSE(a_->is_open());
  EXPECT_EQ(a_->queued_send_bytes(), 0u);
}

TEST_F(QueuedChannelTest, APeerThatTakesNothingForTheSendTimeoutIsDropped) {
  Open(64 << 20);
  ASSERT_GT(FillSocket(), 0);
  clock_.Advance(900ms);
  EXPECT_TRUE(a_->Send(Heartbeat{.epoch = 0, .seq = 1}).ok()) << "still within the timeout";
  clock_.Advance(200ms);
  Status sent = a_->Send(Heartbeat{.epoch = 0, .seq = 2});
  EXPECT_EQ(sent.code(), StatusCode::kDeadlineExceeded) << sent.ToString();
  EXPECT_FALSE(a_->is_open());
}

// With nothing more to send, a peer that stopped reading is still cut off (by a timer), and
// the owner learns it from its pending receive.
TEST_F(QueuedChannelTest, APeerThatStopsReadingIsDroppedWithNothingMoreToSend) {
  Open(64 << 20, 50ms);
  std::optional<Status> received;
  a_->AsyncReceive([&](Result<ReceivedMessage> msg) { received = msg.status(); });
  ASSERT_GT(FillSocket(), 0);
  clock_.Advance(60ms);  // the channel's clock: the peer has taken nothing for 60 ms
  for (int i = 0; i < 200 && a_->is_open(); ++i) io_.run_for(20ms);
  EXPECT_FALSE(a_->is_open());
  EXPECT_EQ(a_->queued_send_bytes(), 0u);
  for (int i = 0; i < 50 && !received.has_value(); ++i) io_.run_for(20ms);
  ASSERT_TRUE(received.has_value());
  EXPECT_EQ(received->code(), StatusCode::kUnavailable) << received->ToString();
}

// The backlog limit counts what waits behind the frame being written: one frame as large as
// the limit (a RegisterAck's tensor table) does not cut off the message after it.
TEST_F(QueuedChannelTest, AFrameAsLargeAsTheLimitLeavesRoomBehindIt) {
  Open(1 << 20);
  // Larger than the socket buffer: most of it stays queued, as the frame being written.
  ASSERT_TRUE(a_->Send(Stop{.reason = std::string(1000 << 10, 'L')}).ok());
  ASSERT_GT(a_->queued_send_bytes(), size_t{512} << 10);
  for (int i = 0; i < 3; ++i) {
    const Status sent = a_->Send(Stop{.reason = Reason(i)});
    ASSERT_TRUE(sent.ok()) << sent.ToString();
  }
  EXPECT_TRUE(a_->is_open());
  EXPECT_EQ(a_->Send(Stop{.reason = Reason(3)}).code(), StatusCode::kResourceExhausted)
      << "four frames of 256 KiB behind it pass the limit";
}

// A queued frame whose fds cannot be copied (the process is out of descriptors) is refused
// before it takes any of the shared send budget, and the channel stays usable.
TEST_F(QueuedChannelTest, AnFdCopyThatFailsTakesNothingFromTheSharedBudget) {
  auto budget = std::make_shared<SendBudget>(size_t{64} << 20);
  Open(64 << 20);
  a_->SetSendBudget(budget);
  ASSERT_GT(FillSocket(), 0);  // the next frame is queued, with copies of its fds
  const size_t used = budget->used();
  ASSERT_GT(used, 0u);
  Pipe pipe;
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit none = saved;
  none.rlim_cur = 1;  // no descriptor number is free below 1: every copy fails with EMFILE
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &none), 0);
  const Status sent = a_->Send(Stop{.reason = "fd"}, std::vector<int>{pipe.write_end.get()});
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_FALSE(sent.ok());
  EXPECT_NE(sent.message().find("dup of an fd to send"), std::string::npos) << sent.ToString();
  EXPECT_EQ(budget->used(), used) << "the failed frame took nothing";
  EXPECT_TRUE(a_->is_open());
  EXPECT_TRUE(a_->Send(Stop{.reason = "after"}, std::vector<int>{pipe.write_end.get()}).ok());
  EXPECT_GT(budget->used(), used);
}

}  // namespace
}  // namespace baton::proto
