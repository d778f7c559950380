// EngineOutcomes' pruning on the fake clock: an engine unlisted for the retention, with
// nothing held on it, is forgotten; a listed one (a primary, a canary) never is; a fleet's
// nodes are pruned each on its own listing; after many failovers the RouterReport stays far
// below the frame limit that it would otherwise pass; and a router following a fake
// controller forgets the engine it failed over from, in its reports and /metrics.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "proto/wire/frame.h"
#include "router/canary/engine_outcomes.h"
#include "router/router.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/proto/proto_test_util.h"
#include "tests/router/scripted_backend.h"
#include "tests/router/wait_for.h"

namespace baton {
namespace {

using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::seconds;

constexpr Duration kRetention = minutes(10);

std::vector<uint64_t> Ids(const std::vector<proto::EngineOutcome>& outcomes) {
  std::vector<uint64_t> ids;
  for (const proto::EngineOutcome& o : outcomes) ids.push_back(o.engine_id);
  return ids;
}

size_t ReportBytes(const EngineOutcomes& o) {
  proto::RouterReport report{.seq = 1, .engines = o.Snapshot(), .router = "0123456789abcdef"};
  Result<std::string> payload = proto::Encode(report);
  EXPECT_TRUE(payload.ok()) << payload.status().ToString();
  return payload.ok() ? payload->size() : 0;
}

TEST(EngineOutcomesPruneTest, AnEngineUnlistedForTheRetentionIsForgotten) {
  FakeClock clock;
  EngineOutcomes o;
  o.SetListed({{"", {1, 2}}}, clock.Now());  // primary 1, standby 2
  o.RecordSucceeded(1, milliseconds(10));
  o.RecordFailed(1);
  clock.Advance(seconds(1));
  o.SetListed({{"", {2, 3}}}, clock.Now());  // 1 failed over to 2; 3 the new standby
  o.RecordSucceeded(2, milliseconds(10));
  clock.Advance(kRetention - milliseconds(1));
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 0u);
  EXPECT_EQ(Ids(o.Snapshot()), (std::vector<uint64_t>{1, 2}));
  clock.Advance(milliseconds(1));
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 1u);
  EXPECT_EQ(Ids(o.Snapshot()), (std::vector<uint64_t>{2}));
  EXPECT_EQ(o.Snapshot()[0].requests, 1u) << "a kept engine's counters are untouched";
}

TEST(EngineOutcomesPruneTest, ListedEnginesAreNeverForgotten) {
  FakeClock clock;
  EngineOutcomes o;
  o.SetListed({{"", {1, 2}}}, clock.Now());  // a primary and its canary, for hours
  o.RecordSucceeded(1, milliseconds(10));
  o.RecordComparison(2, true);
  for (int i = 0; i < 10; ++i) {
    clock.Advance(minutes(30));
    EXPECT_EQ(o.Prune(clock.Now(), kRetention), 0u);
  }
  EXPECT_EQ(Ids(o.Snapshot()), (std::vector<uint64_t>{1, 2}));
}

TEST(EngineOutcomesPruneTest, NothingIsForgottenBeforeTheFirstListing) {
  FakeClock clock;
  EngineOutcomes o;
  o.RecordSucceeded(1, milliseconds(10));
  clock.Advance(minutes(60));
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 0u);
  EXPECT_EQ(o.Snapshot().size(), 1u);
}

TEST(EngineOutcomesPruneTest, ListedAgainTheRetentionStartsOver) {
  FakeClock clock;
  EngineOutcomes o;
  o.SetListed({{"", {1}}}, clock.Now());
  o.RecordSucceeded(1, milliseconds(10));
  o.SetListed({{"", {}}}, clock.Now());  // a table without it (a restarting controller's)
  clock.Advance(minutes(9));
  o.SetListed({{"", {1}}}, clock.Now());  // back
  clock.Advance(minutes(2));
  o.SetListed({{"", {}}}, clock.Now());
  clock.Advance(minutes(9));
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 0u);
  clock.Advance(minutes(1));
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 1u);
}

TEST(EngineOutcomesPruneTest, AnEngineWithSomethingInFlightIsKeptUntilItEnds) {
  FakeClock clock;
  EngineOutcomes o;
  o.SetListed({{"", {1}}}, clock.Now());
  o.Hold("", 1);  // a long stream
  o.Hold("", 1);  // and a shadow comparison
  o.SetListed({{"", {2}}}, clock.Now());
  clock.Advance(kRetention * 2);
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 0u);
  o.RecordSucceeded(1, milliseconds(10));
  o.Release("", 1);
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 0u);
  o.RecordComparison(1, true);
  o.Release("", 1);
  o.Release("", 1);  // one too many: nothing
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 1u);
  EXPECT_TRUE(o.Snapshot().empty());
}

TEST(EngineOutcomesPruneTest, AnEngineFirstSeenUnlistedCountsFromTheTableThatLeftItOut) {
  FakeClock clock;
  EngineOutcomes o;
  o.SetListed({{"", {2}}}, clock.Now());
  clock.Advance(minutes(6));
  o.RecordEnded(1);  // an attempt on 1 ended after the table dropped it
  clock.Advance(minutes(4));
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 1u);
}

TEST(EngineOutcomesPruneTest, AFleetRouterPrunesEachNodeOnItsOwnTable) {
  FakeClock clock;
  EngineOutcomes o;
  o.SetListed({{"a", {1}}, {"b", {1, 2}}}, clock.Now());  // engine ids are a node's own
  o.RecordSucceeded("a", 1, milliseconds(10));
  o.RecordSucceeded("b", 1, milliseconds(10));
  o.RecordSucceeded("b", 2, milliseconds(10));
  o.SetListed({{"a", {1}}, {"b", {2}}}, clock.Now());  // b failed over from 1 to 2
  clock.Advance(minutes(5));
  o.SetListed({{"b", {2}}}, clock.Now());  // a left the fleet
  clock.Advance(minutes(5));
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 1u);  // b's engine 1
  EXPECT_EQ(o.Nodes(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Ids(o.Snapshot("b")), (std::vector<uint64_t>{2}));
  clock.Advance(minutes(5));
  EXPECT_EQ(o.Prune(clock.Now(), kRetention), 1u);  // a's engine 1
  EXPECT_EQ(o.Nodes(), (std::vector<std::string>{"b"}));
}

// A crash-looping primary, replaced every 5 s for three days: without pruning the report
// passes the frame limit (the subscription could then carry no route table,
// route_subscriber.h); with it, it holds the last ten minutes' engines.
TEST(EngineOutcomesPruneTest, TheReportStaysBoundedAfterManyFailovers) {
  FakeClock clock;
  EngineOutcomes pruned;
  EngineOutcomes kept;
  constexpr uint64_t kFailovers = 50000;
  size_t largest = 0;
  for (uint64_t id = 1; id <= kFailovers; ++id) {
    pruned.SetListed({{"", {id, id + 1}}}, clock.Now());  // primary id, standby id + 1
    for (EngineOutcomes* o : {&pruned, &kept}) {
      o->Hold("", id);
      o->RecordSucceeded(id, milliseconds(3));
      o->Release("", id);
      o->Hold("", id);
      o->RecordFailed(id);
      o->Release("", id);
    }
    clock.Advance(seconds(5));
    pruned.Prune(clock.Now(), kRetention);
    largest = std::max(largest, pruned.Snapshot().size());
  }
  EXPECT_LE(largest, 121u);  // 10 min of one engine per 5 s, and the listed one
  EXPECT_EQ(pruned.Snapshot().back().engine_id, kFailovers);
  EXPECT_EQ(pruned.Snapshot().back().requests, 2u);
  EXPECT_LT(ReportBytes(pruned), 8u << 10);
  EXPECT_EQ(kept.Snapshot().size(), kFailovers);
  EXPECT_GT(ReportBytes(kept), proto::kDefaultMaxFrameSize);
}

std::string Ok() {
  const std::string body = R"({"id":"c","choices":[{"text":"hi","finish_reason":"length"}]})";
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

proto::RouteTable PrimaryAt(uint64_t version, uint64_t engine, uint16_t port) {
  proto::RouteTable table{.version = version, .epoch = version, .pair_state = "ready"};
  table.entries.push_back({.engine_id = engine,
                           .role = proto::EngineRole::kPrimary,
                           .http_address = "127.0.0.1:" + std::to_string(port),
                           .ready = true,
                           .weight = 100});
  return table;
}

// The router's subscription, accepted as a controller does.
Result<proto::Channel> AcceptRouter(proto::Listener& listener) {
  BATON_ASSIGN_OR_RETURN(proto::Channel channel, listener.Accept(seconds(20)));
  BATON_RETURN_IF_ERROR(proto::ServerHello(channel, {.server_name = "fake-controller"}).status());
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(seconds(20)));
  BATON_RETURN_IF_ERROR(msg.As<proto::Subscribe>().status());
  return channel;
}

// The engine ids of the first RouterReport on `channel` that lists `want`, or of the last
// of 8 reports read (other messages skipped).
Result<std::vector<uint64_t>> ReportListing(proto::Channel& channel,
                                            const std::vector<uint64_t>& want) {
  std::vector<uint64_t> ids;
  for (int reports = 0; reports < 8;) {
    BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(seconds(20)));
    if (msg.type != proto::MsgType::kRouterReport) continue;
    BATON_ASSIGN_OR_RETURN(proto::RouterReport report, msg.As<proto::RouterReport>());
    ids = Ids(report.engines);
    if (ids == want) break;
    ++reports;
  }
  return ids;
}

TEST(EngineOutcomesPruneTest, ARouterForgetsTheEngineItFailedOverFrom) {
  FakeClock clock;
  ScriptedBackend backend({Ok(), Ok()});
  ASSERT_NE(backend.port(), 0);
  proto::testing::TempDir dir;
  boost::asio::io_context io;
  Result<proto::Listener> listener = proto::Listener::Bind(io, dir.File("controller.sock"));
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  std::optional<proto::Channel> ctl;
  RouterOptions options;
  options.listen_port = 0;
  options.controller_socket = dir.File("controller.sock");
  Router router(std::move(options), clock);
  ASSERT_TRUE(router.Start().ok());
  Result<proto::Channel> accepted = AcceptRouter(*listener);
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  ctl.emplace(std::move(*accepted));
  TestHttpClient client(router.port());
  for (uint64_t engine : {1, 2}) {  // engine 1 serves, then fails over to engine 2
    ASSERT_TRUE(ctl->Send(PrimaryAt(engine, engine, backend.port())).ok());
    ASSERT_TRUE(WaitFor([&] { return router.routes().table().version == engine; }));
    EXPECT_EQ(client.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})").status, 200);
  }
  EXPECT_EQ(Ids(router.outcomes().Snapshot()), (std::vector<uint64_t>{1, 2}));
  clock.Advance(kRetention - seconds(1));
  Result<std::vector<uint64_t>> ids = ReportListing(*ctl, {1, 2});
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, (std::vector<uint64_t>{1, 2}));

  clock.Advance(seconds(1));
  ASSERT_TRUE(WaitFor([&] { return router.outcomes().Snapshot().size() == 1; }));
  EXPECT_EQ(Ids(router.outcomes().Snapshot()), (std::vector<uint64_t>{2}));
  ids = ReportListing(*ctl, {2});
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, (std::vector<uint64_t>{2}));
  const HttpReply m = client.Get("/metrics");
  EXPECT_EQ(m.body.find("engine_id=\"1\""), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("baton_router_engine_requests_total{engine_id=\"2\"} 1\n"),
            std::string::npos)
      << m.body;
  router.Stop();
}

}  // namespace
}  // namespace baton
