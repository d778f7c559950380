// The node record as a controller writes it (FleetMember::RecordOf) read back as a router
// reads it (ParseNodeRecord): every field survives, the optional weights, capacity and load
// are read when present, and a record that is wrong in any field is refused with the field
// named, never thrown on. A router's report read back keeps its outcomes and its stalls; one
// without stalls (as older routers write it) has none, and a reader that does not ask for
// them reads the outcomes of one with stalls.
#include "fleet/fleet_records.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "controller/fleet_member.h"

namespace baton {
namespace {

using nlohmann::json;

constexpr char kKey[] = "/baton/nodes/node-a";

proto::RouteTable Routes() {
  proto::RouteTable t;
  t.version = 7;
  t.epoch = 2;
  t.pair_state = "ready";
  t.entries.push_back({.engine_id = 2,
                       .role = proto::EngineRole::kPrimary,
                       .http_address = "127.0.2.1:8001",
                       .ready = true,
                       .weight = 100,
                       .engine_version = "refengine-1.0"});
  t.entries.push_back({.engine_id = 3,
                       .role = proto::EngineRole::kStandby,
                       .http_address = "127.0.2.1:8002",
                       .ready = false,
                       .weight = 0,
                       .engine_version = "refengine-1.0"});
  return t;
}

TEST(FleetRecords, TheControllersRecordReadsBackWhole) {
  ControllerConfig config;
  config.fleet_node = "node-a";
  config.fleet_model = "tiny";
  const NodeFacts facts{.weights_id = "00112233aabbccdd",
                        .tensors = 9,
                        .tensor_bytes = 4096,
                        .pool_blocks = 512,
                        .block_bytes = 65536};
  const std::string text =
      FleetMember::RecordOf(config, facts, {.granted_blocks = 128, .leases = 3}, Routes(), 42, 7);
  Result<FleetNode> n = ParseNodeRecord(kKey, text);
  ASSERT_TRUE(n.ok()) << n.status().ToString() << "\n" << text;
  EXPECT_EQ(n->name, "node-a");
  EXPECT_EQ(n->model, "tiny");
  EXPECT_EQ(n->controller_pid, 42);
  EXPECT_EQ(n->controller_started_at, 7);
  EXPECT_EQ(n->routes.version, 7u);
  EXPECT_EQ(n->routes.epoch, 2u);
  ASSERT_EQ(n->routes.entries.size(), 2u);
  EXPECT_TRUE(n->routes.entries[0].ready);
  EXPECT_FALSE(n->routes.entries[1].ready);
  EXPECT_EQ(n->routes.entries[0].weight, 100u);
  EXPECT_EQ(n->routes.entries[0].engine_version, "refengine-1.0");
  EXPECT_EQ(n->weights_id, "00112233aabbccdd");
  EXPECT_EQ(n->pool_blocks, 512u);
  EXPECT_EQ(n->pool_granted_blocks, 128u);
  EXPECT_DOUBLE_EQ(n->Load(), 0.25);
}

TEST(FleetRecords, ARecordWithoutUseFieldsReadsAsEmpty) {
  const json record = {
      {"node", "node-b"},
      {"model", "tiny"},
      {"routes",
       {{"version", 1}, {"epoch", 1}, {"pair_state", "ready"}, {"entries", json::array()}}}};
  Result<FleetNode> n = ParseNodeRecord("/baton/nodes/node-b", record.dump());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->weights_id, "");
  EXPECT_EQ(n->pool_blocks, 0u);
  EXPECT_DOUBLE_EQ(n->Load(), 0);
}

TEST(FleetRecords, WrongFieldsAreRefusedByName) {
  const json entry = {{"engine_id", 2},
                      {"role", "primary"},
                      {"http_address", "h:1"},
                      {"ready", true},
                      {"weight", 100}};
  const json good = {
      {"node", "node-a"},
      {"model", "tiny"},
      {"routes",
       {{"version", 1}, {"epoch", 1}, {"pair_state", "ready"}, {"entries", json::array({entry})}}}};
  ASSERT_TRUE(ParseNodeRecord(kKey, good.dump()).ok());
  struct Case {
    const char* field;
    json record;
  };
  std::vector<Case> cases;
  auto with_entry = [&](const char* field, json value) {
    json r = good;
    r["routes"]["entries"][0][field] = std::move(value);
    cases.push_back({field, r});
  };
  with_entry("ready", 1);
  with_entry("weight", true);
  with_entry("weight", -5);
  with_entry("engine_id", "two");
  with_entry("weight", 4294967396);  // would wrap to 100 as a uint32_t
  with_entry("weight", 3000000000);  // negative as an int in the weighted round robin
  with_entry("weight", 101);         // a percentage
  json r = good;
  r["routes"]["epoch"] = false;
  cases.push_back({"epoch", r});
  r = good;
  r.erase("model");
  cases.push_back({"model", r});
  for (const Case& c : cases) {
    Result<FleetNode> n = ParseNodeRecord(kKey, c.record.dump());
    ASSERT_FALSE(n.ok()) << c.record.dump();
    EXPECT_NE(n.status().message().find(c.field), std::string::npos) << n.status().ToString();
  }
  // Use fields of the wrong type are read as absent, not refused.
  r = good;
  r["capacity"] = {{"pool_blocks", "many"}};
  r["load"] = true;
  r["weights"] = {{"id", 5}};
  Result<FleetNode> n = ParseNodeRecord(kKey, r.dump());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->pool_blocks, 0u);
  EXPECT_EQ(n->weights_id, "");
  EXPECT_FALSE(ParseNodeRecord(kKey, "[1,2]").ok());
  EXPECT_FALSE(ParseNodeRecord(kKey, "{not json").ok());
}

// A record speaks for the node of its key only: one under nodes/zzz that says node-a would
// take node-a's primary in the routers, and keep node-a listed after node-a's own key expired.
TEST(FleetRecords, ARecordNamingAnotherNodeThanItsKeyIsRefused) {
  const json record = {
      {"node", "node-a"},
      {"model", "tiny"},
      {"routes",
       {{"version", 1}, {"epoch", 1}, {"pair_state", "ready"}, {"entries", json::array()}}}};
  EXPECT_TRUE(ParseNodeRecord("/baton/nodes/node-a", record.dump()).ok());
  for (const char* key : {"/baton/nodes/zzz", "/baton/nodes/node-a-2", "node-a/x"}) {
    Result<FleetNode> n = ParseNodeRecord(key, record.dump());
    ASSERT_FALSE(n.ok()) << key;
    EXPECT_NE(n.status().message().find("field 'node' is 'node-a', not the key's node"),
              std::string::npos)
        << n.status().ToString();
  }
}

constexpr char kReportKey[] = "/baton/reports/node-a/r1";

proto::RouterReport Report() {
  return {.seq = 4,
          .engines = {{.engine_id = 2,
                       .requests = 9,
                       .errors = 1,
                       .duration_ms = 800,
                       .succeeded = 8,
                       .compared = 3,
                       .disagreed = 1}},
          .router = "r1"};
}

TEST(FleetRecordsTest, AReportKeepsItsOutcomesAndItsStalls) {
  const std::vector<proto::EngineStalled> stalls = {
      {.engine_id = 2, .streams = 3, .quiet_ms = 31000}, {.engine_id = 5, .streams = 1}};
  const std::string text = RouterReportJson(Report(), stalls);
  Result<proto::RouterReport> r = ParseRouterReport(kReportKey, text);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->router, "r1");
  EXPECT_EQ(r->seq, 4u);
  EXPECT_EQ(r->engines, Report().engines);
  Result<std::vector<proto::EngineStalled>> parsed = ParseReportStalls(kReportKey, text);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const std::vector<proto::EngineStalled>& read = *parsed;
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].engine_id, 2u);
  EXPECT_EQ(read[0].streams, 3u);
  EXPECT_EQ(read[0].quiet_ms, 31000u);
  EXPECT_EQ(read[0].router, "r1") << "a stall is the report's router's";
  EXPECT_EQ(read[1].engine_id, 5u);
}

TEST(FleetRecordsTest, AReportWithoutStallsHasNone) {
  const std::string text = RouterReportJson(Report());
  EXPECT_FALSE(json::parse(text).contains("stalls")) << "none is left out: " << text;
  // As a router before stalls wrote it.
  const json old = {{"router", "r0"},
                    {"seq", 1},
                    {"engines",
                     {{{"engine_id", 7},
                       {"requests", 2},
                       {"errors", 0},
                       {"duration_ms", 40},
                       {"succeeded", 2},
                       {"compared", 0},
                       {"disagreed", 0}}}}};
  for (const std::string& t : {text, old.dump()}) {
    Result<proto::RouterReport> r = ParseRouterReport(kReportKey, t);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->engines.size(), 1u);
    Result<std::vector<proto::EngineStalled>> read = ParseReportStalls(kReportKey, t);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_TRUE(read->empty()) << t;
  }
}

// Wrong stalls are refused with the field named, and cost the report's outcomes nothing.
TEST(FleetRecordsTest, AReportWithAWrongStallIsRefusedWithTheFieldNamed) {
  json good = json::parse(RouterReportJson(Report(), {{.engine_id = 2, .streams = 1}}));
  std::vector<std::pair<std::string, json>> cases;
  json r = good;
  r["stalls"] = "many";
  cases.push_back({"stalls", r});
  r = good;
  r["stalls"][0]["quiet_ms"] = -1;
  cases.push_back({"quiet_ms", r});
  r = good;
  r["stalls"][0].erase("streams");
  cases.push_back({"streams", r});
  r = good;
  r["stalls"][0] = 3;
  cases.push_back({"stall", r});
  for (const auto& [field, record] : cases) {
    Result<std::vector<proto::EngineStalled>> got = ParseReportStalls(kReportKey, record.dump());
    ASSERT_FALSE(got.ok()) << record.dump();
    EXPECT_NE(got.status().message().find(field), std::string::npos) << got.status().ToString();
    Result<proto::RouterReport> outcomes = ParseRouterReport(kReportKey, record.dump());
    ASSERT_TRUE(outcomes.ok()) << outcomes.status().ToString();
    EXPECT_EQ(outcomes->engines, Report().engines);
  }
}

}  // namespace
}  // namespace baton
