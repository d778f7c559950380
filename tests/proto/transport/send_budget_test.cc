// SendBudget: queued-mode channels sharing one limit on what they hold unsent together.
#include "proto/transport/send_budget.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <string>

#include "proto/transport/channel.h"

namespace baton::proto {
namespace {

using namespace std::chrono_literals;

TEST(SendBudgetTest, TakesWhatFitsAndGivesBack) {
  SendBudget b(100);
  EXPECT_TRUE(b.TryTake(60));
  EXPECT_FALSE(b.TryTake(41));
  EXPECT_TRUE(b.TryTake(40));
  EXPECT_EQ(b.used(), 100u);
  b.Give(70);
  EXPECT_EQ(b.used(), 30u);
  b.Give(1000);  // never below nothing
  EXPECT_EQ(b.used(), 0u);
}

class SharedBudgetTest : public ::testing::Test {
 protected:
  // A channel pair whose sending end (first) takes from `budget`.
  std::pair<Channel, Channel> Open() {
    auto pair = Channel::Pair(io_, ChannelOptions{.send_timeout = 1s,
                                                  .max_queued_send_bytes = 8 << 20,
                                                  .send_budget = budget_,
                                                  .label = "client",
                                                  .clock = &clock_});
    EXPECT_TRUE(pair.ok()) << pair.status().ToString();
    return std::move(pair).value();
  }
  // Sends 256 KiB frames on `c` (whose peer reads nothing) until `queued` bytes wait or a
  // send fails; returns the first failure, or OK.
  static Status Queue(Channel& c, size_t queued) {
    for (int i = 0; i < 1000 && c.queued_send_bytes() < queued; ++i) {
      Status s = c.Send(Stop{.reason = std::string(256 << 10, 'x')});
      if (!s.ok()) return s;
    }
    return OkStatus();
  }

  boost::asio::io_context io_;
  FakeClock clock_;
  std::shared_ptr<SendBudget> budget_ = std::make_shared<SendBudget>(size_t{3} << 20);
};

TEST_F(SharedBudgetTest, PeersThatStopReadingShareOneLimit) {
  auto [a, a_peer] = Open();
  auto [b, b_peer] = Open();
  ASSERT_TRUE(Queue(a, size_t{2} << 20).ok());  // within a's own 8 MiB and the 3 MiB shared
  EXPECT_EQ(budget_->used(), a.queued_send_bytes());
  Status s = Queue(b, size_t{2} << 20);  // b would take the shared total past 3 MiB
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("unsent together"), std::string::npos) << s.ToString();
  EXPECT_FALSE(b.is_open());
  EXPECT_TRUE(a.is_open()) << "the channel that found the budget spent is the one closed";
  EXPECT_EQ(budget_->used(), a.queued_send_bytes()) << "b gave back what it held";
  a.Close();
  EXPECT_EQ(budget_->used(), 0u);
}

TEST_F(SharedBudgetTest, ATrustedChannelLeavesTheBudget) {
  auto [a, a_peer] = Open();
  ASSERT_TRUE(Queue(a, size_t{2} << 20).ok());
  const size_t held = a.queued_send_bytes();
  ASSERT_GT(held, 0u);
  a.SetSendBudget(nullptr);  // e.g. an engine, once it is known
  EXPECT_EQ(budget_->used(), 0u);
  EXPECT_TRUE(Queue(a, size_t{6} << 20).ok()) << "only its own limit applies now";
  {
    std::optional<Channel> gone = std::move(a);
    gone.reset();
  }
  EXPECT_EQ(budget_->used(), 0u);
  auto [c, c_peer] = Open();
  ASSERT_TRUE(Queue(c, size_t{2} << 20).ok());
  { Channel closed_with_a_queue = std::move(c); }  // destroyed with frames queued
  EXPECT_EQ(budget_->used(), 0u);
}

}  // namespace
}  // namespace baton::proto
