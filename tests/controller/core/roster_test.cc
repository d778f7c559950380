#include "controller/core/roster.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace baton {
namespace {

Roster TwoEngines() {
  Roster r;
  r.boot_id = "b00t";
  r.incarnation = 3;
  r.next_engine_id = 9;
  r.primary = 7;
  r.engines.push_back(RosterEngine{.id = 7,
                                   .pid = 4242,
                                   .start_time = 1234567,
                                   .token = "00ff",
                                   .launch_role = proto::LaunchRole::kPrimary,
                                   .port = 8101,
                                   .command = {"engine", "--port", "{port}"},
                                   .cgroup = "/sys/fs/cgroup/x/engine-7",
                                   .role = RosterRole::kServing,
                                   .epoch = 12,
                                   .extents = {{0, 8}, {10, 2}},
                                   .version = "v1",
                                   .http_address = "127.0.0.1:8101",
                                   .device_memory = "mapped"});
  RosterEngine standby;
  standby.id = 8;
  standby.pid = 4243;
  standby.role = RosterRole::kStandby;
  r.engines.push_back(standby);
  return r;
}

TEST(RosterTest, RoundTrips) {
  const Roster r = TwoEngines();
  Result<Roster> back = DecodeRoster(EncodeRoster(r), "roster.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, r);
  ASSERT_NE(back->Find(7), nullptr);
  EXPECT_EQ(back->Find(7)->extents[1], (Extent{10, 2}));
  EXPECT_EQ(back->Find(99), nullptr);
}

// A roster written before device_memory was recorded is still read (a controller upgraded
// in place re-adopts its predecessor's engines), with device_memory empty.
TEST(RosterTest, ARosterWithoutDeviceMemoryIsRead) {
  nlohmann::json j = nlohmann::json::parse(EncodeRoster(TwoEngines()));
  for (nlohmann::json& e : j["engines"]) e.erase("device_memory");
  Result<Roster> back = DecodeRoster(j.dump(), "roster.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Find(7)->device_memory, "");
}

TEST(RosterTest, EveryRoleRoundTrips) {
  for (RosterRole role : {RosterRole::kLaunching, RosterRole::kStandby, RosterRole::kPromoting,
                          RosterRole::kServing, RosterRole::kDraining, RosterRole::kFencing}) {
    Result<RosterRole> back = ParseRosterRole(ToString(role));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, role);
  }
  EXPECT_FALSE(ParseRosterRole("boss").ok());
}

void ExpectRefused(const std::string& text, const std::string& fragment) {
  Result<Roster> r = DecodeRoster(text, "roster.json");
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().ToString();
  EXPECT_EQ(r.status().message().rfind("roster.json", 0), 0u) << "names the file";
}

TEST(RosterTest, RefusesWhatItCannotTrust) {
  const std::string good = EncodeRoster(TwoEngines());
  ExpectRefused("", "not a JSON object");
  ExpectRefused(good.substr(0, good.size() / 2), "not a JSON object");
  ExpectRefused("{\"format\": 2}", "format 2");
  std::string no_pid = good;
  no_pid.replace(no_pid.find("\"pid\""), 5, "\"pod\"");
  ExpectRefused(no_pid, "'pid' is missing");
  std::string bad_role = good;
  bad_role.replace(bad_role.find("\"serving\""), 9, "\"ruling\"");
  ExpectRefused(bad_role, "unknown roster role");
  std::string twice = good;
  twice.replace(twice.find("\"id\": 8"), 7, "\"id\": 7");
  ExpectRefused(twice, "listed twice");
  std::string empty_extent = good;
  empty_extent.replace(empty_extent.find("10,"), 3, "10, 0],[1,");
  Result<Roster> r = DecodeRoster(empty_extent, "roster.json");
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace baton
