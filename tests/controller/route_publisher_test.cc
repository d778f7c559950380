// RoutePublisher with in-process subscribers (socket pairs on one io_context): tables sent,
// RouterReports summed across subscribers, a leaving subscriber's last report kept in the
// totals, a subscriber sending a malformed report or another message dropped, and fleet
// routers' reports (through etcd) counted as routers heard from.
#include "controller/route_publisher.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>

namespace baton {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

proto::EngineOutcome Outcome(uint64_t engine, uint64_t requests, uint64_t errors,
                             uint64_t duration_ms, uint64_t succeeded) {
  return {.engine_id = engine,
          .requests = requests,
          .errors = errors,
          .duration_ms = duration_ms,
          .succeeded = succeeded};
}

class RoutePublisherTest : public ::testing::Test {
 protected:
  // A new subscriber; returns the router's end of its channel.
  proto::Channel Subscribe(const std::string& name) {
    Result<std::pair<proto::Channel, proto::Channel>> pair = proto::Channel::Pair(io_);
    EXPECT_TRUE(pair.ok()) << pair.status().ToString();
    publisher_.AddSubscriber(std::make_unique<proto::Channel>(std::move(pair->first)), name);
    return std::move(pair->second);
  }
  // Runs the io_context until `done` (at most 20 s).
  bool RunUntil(const std::function<bool()>& done) {
    for (int i = 0; i < 2000 && !done(); ++i) io_.run_for(milliseconds(10));
    return done();
  }
  // Sends `report` and runs until the publisher's totals for `engine` read `requests`.
  void Report(proto::Channel& router, const proto::RouterReport& report, uint64_t engine,
              uint64_t requests) {
    ASSERT_TRUE(router.Send(report).ok());
    ASSERT_TRUE(RunUntil([&] { return Total(engine).requests == requests; }))
        << "engine " << engine << " at " << Total(engine).requests << " requests";
  }
  proto::EngineOutcome Total(uint64_t engine) const {
    std::map<uint64_t, proto::EngineOutcome> sum = publisher_.Outcomes();
    auto it = sum.find(engine);
    return it == sum.end() ? proto::EngineOutcome{} : it->second;
  }

  boost::asio::io_context io_;
  RoutePublisher publisher_;
};

TEST_F(RoutePublisherTest, SumsTheLatestReportOfEverySubscriber) {
  proto::Channel a = Subscribe("router-a");
  proto::Channel b = Subscribe("router-b");
  proto::RouteTable table{.version = 0, .epoch = 1, .pair_state = "ready"};
  table.entries.push_back({.engine_id = 1,
                           .role = proto::EngineRole::kPrimary,
                           .http_address = "127.0.0.1:1",
                           .ready = true});
  ASSERT_TRUE(publisher_.Publish(table));
  for (proto::Channel* c : {&a, &b}) {
    Result<proto::ReceivedMessage> msg = c->Receive(seconds(5));
    ASSERT_TRUE(msg.ok()) << msg.status().ToString();
    EXPECT_EQ(msg->As<proto::RouteTable>()->version, 1u);
  }
  EXPECT_TRUE(publisher_.Outcomes().empty());

  Report(a, {.seq = 1, .engines = {Outcome(1, 10, 1, 900, 9), Outcome(2, 2, 0, 200, 2)}}, 1, 10);
  Report(b, {.seq = 1, .engines = {Outcome(1, 5, 0, 500, 5)}}, 1, 15);
  // A later report replaces that subscriber's earlier one (counters are cumulative).
  Report(a, {.seq = 2, .engines = {Outcome(1, 20, 2, 1800, 18), Outcome(2, 4, 1, 300, 3)}}, 1, 25);
  const std::map<uint64_t, proto::EngineOutcome> sum = publisher_.Outcomes();
  ASSERT_EQ(sum.size(), 2u);
  EXPECT_EQ(sum.at(1), Outcome(1, 25, 2, 2300, 23));
  EXPECT_EQ(sum.at(2), Outcome(2, 4, 1, 300, 3));
  EXPECT_EQ(publisher_.subscriber_count(), 2u);
}

// A canary's shadow comparisons travel in the report and are summed like the other counters.
TEST_F(RoutePublisherTest, SumsComparisonsAcrossRouters) {
  proto::Channel a = Subscribe("router-a");
  proto::Channel b = Subscribe("router-b");
  proto::EngineOutcome canary = Outcome(2, 10, 0, 100, 10);
  canary.compared = 4;
  canary.disagreed = 1;
  Report(a, {.seq = 1, .engines = {canary}}, 2, 10);
  canary.compared = 3;
  canary.disagreed = 0;
  Report(b, {.seq = 1, .engines = {canary}}, 2, 20);
  EXPECT_EQ(Total(2).compared, 7u);
  EXPECT_EQ(Total(2).disagreed, 1u);
}

TEST_F(RoutePublisherTest, KeepsTheLastReportOfASubscriberThatLeft) {
  proto::Channel a = Subscribe("router-a");
  std::optional<proto::Channel> b = Subscribe("router-b");
  Report(a, {.seq = 1, .engines = {Outcome(1, 10, 1, 900, 9)}}, 1, 10);
  Report(*b, {.seq = 1, .engines = {Outcome(1, 5, 2, 300, 3)}}, 1, 15);
  b.reset();  // router-b goes away
  ASSERT_TRUE(RunUntil([&] { return publisher_.subscriber_count() == 1; }));
  EXPECT_EQ(Total(1), Outcome(1, 15, 3, 1200, 12));
  Report(a, {.seq = 2, .engines = {Outcome(1, 11, 1, 1000, 10)}}, 1, 16);
  EXPECT_EQ(Total(1), Outcome(1, 16, 3, 1300, 13));

  a.Close();  // the last one leaves too: nothing goes backwards
  ASSERT_TRUE(RunUntil([&] { return publisher_.subscriber_count() == 0; }));
  EXPECT_EQ(Total(1), Outcome(1, 16, 3, 1300, 13));
}

TEST_F(RoutePublisherTest, ARouterThatReconnectsReplacesItsOwnReport) {
  std::optional<proto::Channel> a = Subscribe("router-a");
  proto::Channel b = Subscribe("router-b");
  Report(*a, {.seq = 1, .engines = {Outcome(1, 10, 1, 900, 9)}, .router = "aaaa"}, 1, 10);
  Report(b, {.seq = 1, .engines = {Outcome(1, 5, 0, 500, 5)}, .router = "bbbb"}, 1, 15);
  a.reset();  // router-a's connection drops; it reconnects and reports from its start on
  ASSERT_TRUE(RunUntil([&] { return publisher_.subscriber_count() == 1; }));
  EXPECT_EQ(Total(1).requests, 15u) << "the report of a router that left stays";
  proto::Channel again = Subscribe("router-a");
  Report(again, {.seq = 2, .engines = {Outcome(1, 12, 1, 1100, 11)}, .router = "aaaa"}, 1, 17);
  EXPECT_EQ(Total(1), Outcome(1, 17, 1, 1600, 16)) << "counted once, not 10 + 12";
}

// A router prunes an engine long gone from its route table: its next report leaves it out.
// That engine's sum loses this router's share; every other engine's is untouched.
TEST_F(RoutePublisherTest, AnEngineARouterStopsReportingLeavesOnlyItsOwnSum) {
  proto::Channel a = Subscribe("router-a");
  proto::Channel b = Subscribe("router-b");
  Report(a,
         {.seq = 1,
          .engines = {Outcome(1, 10, 1, 900, 9), Outcome(2, 4, 0, 400, 4)},
          .router = "aaaa"},
         2, 4);
  Report(b, {.seq = 1, .engines = {Outcome(1, 5, 0, 500, 5)}, .router = "bbbb"}, 1, 15);
  Report(a, {.seq = 2, .engines = {Outcome(2, 6, 0, 600, 6)}, .router = "aaaa"}, 2, 6);
  EXPECT_EQ(Total(1), Outcome(1, 5, 0, 500, 5));
  EXPECT_EQ(Total(2), Outcome(2, 6, 0, 600, 6));
}

TEST_F(RoutePublisherTest, MalformedReportDropsThatSubscriberOnly) {
  proto::Channel a = Subscribe("router-a");
  proto::Channel b = Subscribe("router-b");
  Report(a, {.seq = 1, .engines = {Outcome(1, 10, 1, 900, 9)}}, 1, 10);
  Report(b, {.seq = 1, .engines = {Outcome(1, 5, 0, 500, 5)}}, 1, 15);
  ASSERT_TRUE(b.SendFrame(proto::MsgType::kRouterReport, "\x01\x02\x03").ok());
  ASSERT_TRUE(RunUntil([&] { return publisher_.subscriber_count() == 1; }));
  Result<proto::ReceivedMessage> why = b.Receive(seconds(5));
  ASSERT_TRUE(why.ok()) << why.status().ToString();
  Status told = why->As<proto::RouterReport>().status();
  EXPECT_NE(told.message().find("bad RouterReport"), std::string::npos) << told.ToString();
  EXPECT_FALSE(b.Receive(seconds(5)).ok()) << "the connection is closed";
  EXPECT_EQ(Total(1), Outcome(1, 15, 1, 1400, 14));  // its last good report stays counted

  Report(a, {.seq = 2, .engines = {Outcome(1, 12, 1, 1100, 11)}}, 1, 17);  // a is still served
  ASSERT_TRUE(a.Send(proto::Subscribe{.subscriber = "router-a"}).ok());
  ASSERT_TRUE(a.Send(proto::Heartbeat{.epoch = 0, .seq = 1}).ok());  // not for a router
  ASSERT_TRUE(RunUntil([&] { return publisher_.subscriber_count() == 0; }));
}

// A fleet router never subscribes to the controller's socket: its reports come through etcd.
// The canary judge hears from it all the same, and so does the count that `batonctl status`
// reads to say that no router feeds the judge.
TEST_F(RoutePublisherTest, FleetRoutersReportingThroughEtcdAreCountedWithTheSubscribers) {
  EXPECT_EQ(publisher_.router_count(), 0u);
  publisher_.StoreFleetReport({.seq = 1, .engines = {Outcome(1, 4, 0, 400, 4)}, .router = "r1"});
  EXPECT_EQ(publisher_.subscriber_count(), 0u);
  EXPECT_EQ(publisher_.router_count(), 1u);
  publisher_.StoreFleetReport({.seq = 2, .engines = {Outcome(1, 6, 0, 600, 6)}, .router = "r1"});
  publisher_.StoreFleetReport({.seq = 1, .engines = {Outcome(1, 1, 0, 100, 1)}, .router = "r2"});
  EXPECT_EQ(publisher_.router_count(), 2u) << "a router's later report replaces its own";
  EXPECT_EQ(Total(1).requests, 7u);
  proto::Channel a = Subscribe("router-a");
  EXPECT_EQ(publisher_.router_count(), 3u);
}

// When a router's report last showed an engine answer a request well: what the controller
// checks a stall report against (a router whose streams all wait is no proof of a hang while
// another router sees the engine answer).
TEST_F(RoutePublisherTest, LastSuccessIsWhenAReportShowedTheEngineAnswer) {
  FakeClock clock;
  publisher_.SetClock(&clock);
  EXPECT_FALSE(publisher_.LastSuccess(1).has_value());
  publisher_.StoreFleetReport({.seq = 1, .engines = {Outcome(1, 4, 0, 400, 4)}, .router = "r1"});
  EXPECT_FALSE(publisher_.LastSuccess(1).has_value()) << "a first report says not when";
  clock.Advance(seconds(5));
  publisher_.StoreFleetReport({.seq = 2, .engines = {Outcome(1, 6, 2, 400, 4)}, .router = "r1"});
  EXPECT_FALSE(publisher_.LastSuccess(1).has_value()) << "failed attempts are no answer";
  clock.Advance(seconds(5));
  const TimePoint answered = clock.Now();
  publisher_.StoreFleetReport({.seq = 3, .engines = {Outcome(1, 7, 2, 500, 5)}, .router = "r1"});
  clock.Advance(seconds(5));
  publisher_.StoreFleetReport({.seq = 1, .engines = {Outcome(1, 9, 0, 900, 9)}, .router = "r2"});
  ASSERT_TRUE(publisher_.LastSuccess(1).has_value());
  EXPECT_EQ(*publisher_.LastSuccess(1), answered);
  EXPECT_FALSE(publisher_.LastSuccess(2).has_value());
}

TEST_F(RoutePublisherTest, LastSuccessIsForgottenOnceNoRouterReportsTheEngine) {
  FakeClock clock;
  publisher_.SetClock(&clock);
  publisher_.StoreFleetReport({.seq = 1, .engines = {Outcome(1, 1, 0, 100, 1)}, .router = "r1"});
  publisher_.StoreFleetReport({.seq = 1, .engines = {Outcome(1, 1, 0, 100, 1)}, .router = "r2"});
  clock.Advance(seconds(1));
  publisher_.StoreFleetReport({.seq = 2, .engines = {Outcome(1, 2, 0, 200, 2)}, .router = "r1"});
  ASSERT_TRUE(publisher_.LastSuccess(1).has_value());
  // r1 forgot engine 1 (long gone from its table); r2 still names it.
  publisher_.StoreFleetReport({.seq = 3, .engines = {Outcome(2, 1, 0, 100, 1)}, .router = "r1"});
  EXPECT_TRUE(publisher_.LastSuccess(1).has_value());
  publisher_.StoreFleetReport({.seq = 2, .engines = {Outcome(2, 1, 0, 100, 1)}, .router = "r2"});
  EXPECT_FALSE(publisher_.LastSuccess(1).has_value());
}

}  // namespace
}  // namespace baton
