// The fleet's records (fleet/fleet_records.h) as a controller writes them: a node's record
// with its route entries (booleans among them) parses; a wrong field is refused by name.
#include "fleet/fleet_records.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

constexpr const char* kRecord =
    R"({"node": "node-a", "model": "tiny", "controller": {"pid": 42, "started_at": 7},
        "routes": {"version": 3, "epoch": 2, "pair_state": "ready",
                   "entries": [{"engine_id": 1, "role": "primary", "http_address": "a:1",
                                "ready": true, "weight": 100, "engine_version": "v2"},
                               {"engine_id": 2, "role": "standby", "http_address": "a:2",
                                "ready": false, "weight": 0, "engine_version": "v2"}]}})";

TEST(FleetRecords, ANodeRecordWithItsEntriesParses) {
  Result<FleetNode> n = ParseNodeRecord("/baton/nodes/node-a", kRecord);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->name, "node-a");
  EXPECT_EQ(n->controller_pid, 42);
  ASSERT_EQ(n->routes.entries.size(), 2u);
  EXPECT_TRUE(n->routes.entries[0].ready);
  EXPECT_FALSE(n->routes.entries[1].ready);
  EXPECT_EQ(n->routes.entries[0].engine_version, "v2");
}

TEST(FleetRecords, AWrongFieldIsRefusedByName) {
  std::string bad = kRecord;
  bad.replace(bad.find("\"ready\": true"), 13, "\"ready\": 1");
  Result<FleetNode> n = ParseNodeRecord("/baton/nodes/node-a", bad);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("'ready'"), std::string::npos) << n.status().message();
}

}  // namespace
}  // namespace baton
