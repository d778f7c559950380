// RouteSubscriber against a fake controller (a real proto::Listener): RouterReports on a
// protocol-4 subscription, none on protocol 3, a report that cannot be sent ending the
// subscription like a failed receive, and one too large for a frame skipped while tables flow.
#include "router/route_subscriber.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <thread>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "tests/proto/proto_test_util.h"
#include "tests/router/wait_for.h"

namespace baton {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// One subscriber accepted on `listener` (Hello with role router, then Subscribe), speaking at
// most `max_version`.
Result<proto::Channel> AcceptSubscriber(proto::Listener& listener,
                                        uint16_t max_version = proto::kProtocolVersionMax) {
  BATON_ASSIGN_OR_RETURN(proto::Channel channel, listener.Accept(seconds(20)));
  BATON_ASSIGN_OR_RETURN(
      proto::AcceptedHello hello,
      proto::ServerHello(channel, {.server_name = "fake-controller", .max_version = max_version}));
  if (hello.hello.role != proto::PeerRole::kRouter) {
    return FailedPrecondition(std::string("role ") + ToString(hello.hello.role));
  }
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(seconds(20)));
  BATON_RETURN_IF_ERROR(msg.As<proto::Subscribe>().status());
  return channel;
}

// The next RouterReport on `channel`.
Result<proto::RouterReport> NextReport(proto::Channel& channel) {
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(seconds(20)));
  return msg.As<proto::RouterReport>();
}

proto::RouteTable OnePrimary(uint64_t version) {
  proto::RouteTable table{.version = version, .epoch = 1, .pair_state = "ready"};
  table.entries.push_back({.engine_id = 1,
                           .role = proto::EngineRole::kPrimary,
                           .http_address = "127.0.0.1:1",
                           .ready = true,
                           .weight = 100,
                           .engine_version = "ref"});
  return table;
}

class RouteSubscriberTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<proto::Listener> listener = proto::Listener::Bind(io_, dir_.File("controller.sock"));
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_.emplace(std::move(*listener));
    sub_.OnReport([this] {
      const uint64_t n = ++snapshots_;
      return std::vector<proto::EngineOutcome>{
          {.engine_id = 2, .requests = n, .errors = 1, .duration_ms = 10 * n, .succeeded = n - 1}};
    });
  }
  void Start() { sub_.Start(dir_.File("controller.sock"), milliseconds(100)); }

  proto::testing::TempDir dir_;
  boost::asio::io_context io_;
  std::optional<proto::Listener> listener_;
  std::atomic<uint64_t> snapshots_{0};
  RouteSubscriber sub_;  // last: stopped before the rest goes
};

TEST_F(RouteSubscriberTest, SendsReportsWithRisingSeqFromProtocol4On) {
  Start();
  Result<proto::Channel> ctl = AcceptSubscriber(*listener_);
  ASSERT_TRUE(ctl.ok()) << ctl.status().ToString();
  EXPECT_EQ(ctl->version(), proto::kProtocolVersionMax);
  EXPECT_GE(ctl->version(), proto::kProtocolVersionRouterReport);
  ASSERT_TRUE(ctl->Send(OnePrimary(1)).ok());

  uint64_t last_seq = 0;
  for (int i = 0; i < 3; ++i) {
    Result<proto::RouterReport> report = NextReport(*ctl);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_GT(report->seq, last_seq);
    last_seq = report->seq;
    ASSERT_EQ(report->engines.size(), 1u);
    EXPECT_EQ(report->engines[0].engine_id, 2u);
    EXPECT_EQ(report->engines[0].errors, 1u);
    EXPECT_GE(report->engines[0].requests, 1u);
  }
  EXPECT_TRUE(WaitFor([&] { return sub_.table().version == 1; }));  // tables still flow
  EXPECT_TRUE(sub_.connected());
  // Counted once the send returned, which may be after the controller received it.
  EXPECT_TRUE(WaitFor([&] { return sub_.reports_sent() >= 3u; }));
}

TEST_F(RouteSubscriberTest, NoReportsOnProtocol3) {
  Start();
  Result<proto::Channel> ctl = AcceptSubscriber(*listener_, proto::kProtocolVersionResume);
  ASSERT_TRUE(ctl.ok()) << ctl.status().ToString();
  EXPECT_EQ(ctl->version(), proto::kProtocolVersionResume);
  ASSERT_TRUE(ctl->Send(OnePrimary(1)).ok());
  ASSERT_TRUE(WaitFor([&] { return sub_.table().version == 1; }));
  // Long past a report interval: nothing came (a late report would fail this, never a slow
  // machine).
  Result<proto::ReceivedMessage> msg = ctl->Receive(milliseconds(1000));
  EXPECT_EQ(msg.status().code(), StatusCode::kDeadlineExceeded)
      << (msg.ok() ? proto::MsgTypeName(msg->type) : msg.status().ToString());
  EXPECT_EQ(sub_.reports_sent(), 0u);
  EXPECT_EQ(snapshots_.load(), 0u);
}

TEST_F(RouteSubscriberTest, AFailedReportEndsTheSubscriptionAndItResubscribes) {
  Start();
  Result<proto::Channel> ctl = AcceptSubscriber(*listener_);
  ASSERT_TRUE(ctl.ok()) << ctl.status().ToString();
  Result<proto::RouterReport> first = NextReport(*ctl);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(sub_.connected());
  // The controller stops reading but keeps the connection: only a send can fail now.
  ASSERT_EQ(::shutdown(ctl->native_handle(), SHUT_RD), 0);

  Result<proto::Channel> again = AcceptSubscriber(*listener_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  Result<proto::RouterReport> next = NextReport(*again);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_GT(next->seq, first->seq);  // seq keeps rising across subscriptions
  EXPECT_TRUE(WaitFor([&] { return sub_.connected(); }));
}

TEST_F(RouteSubscriberTest, AReportOverTheFrameLimitIsSkippedWhileTablesFlow) {
  // An EngineOutcome takes 56 bytes of a frame: 20000 of them are past kDefaultMaxFrameSize.
  auto engines = std::make_shared<std::atomic<uint64_t>>(20000);
  sub_.OnReport([engines] {
    std::vector<proto::EngineOutcome> out;
    for (uint64_t id = 1; id <= engines->load(); ++id) out.push_back({.engine_id = id});
    return out;
  });
  Start();
  Result<proto::Channel> ctl = AcceptSubscriber(*listener_);
  ASSERT_TRUE(ctl.ok()) << ctl.status().ToString();
  ASSERT_TRUE(ctl->Send(OnePrimary(1)).ok());
  ASSERT_TRUE(WaitFor([&] { return sub_.table().version == 1; }))
      << "the subscription must survive a report it cannot send";
  ASSERT_TRUE(ctl->Send(OnePrimary(2)).ok());
  EXPECT_TRUE(WaitFor([&] { return sub_.table().version == 2; }));
  EXPECT_EQ(sub_.reports_sent(), 0u);
  *engines = 3;  // pruned: the next report fits, on the same connection
  Result<proto::RouterReport> report = NextReport(*ctl);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->engines.size(), 3u);
  EXPECT_TRUE(sub_.connected());
}

// A controller that cannot be reached (a wrong socket path, one not started yet) is said once,
// at WARN, however many tries follow; the next subscription's failures would be said again.
TEST(RouteSubscriberUnreachable, IsSaidOnceAtWarnNotAtEveryTry) {
  proto::testing::TempDir dir;
  ::testing::internal::CaptureStderr();
  {
    RouteSubscriber sub;
    sub.Start(dir.File("nosuch.sock"), milliseconds(20));
    std::this_thread::sleep_for(milliseconds(500));  // tries every 20-50 ms meanwhile
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  size_t said = 0;
  for (size_t at = err.find("controller unreachable at"); at != std::string::npos;
       at = err.find("controller unreachable at", at + 1)) {
    ++said;
  }
  EXPECT_EQ(said, 1u) << err;
  EXPECT_NE(err.find("WARN router: controller unreachable at " + dir.File("nosuch.sock")),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace baton
