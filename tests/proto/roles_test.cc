#include "proto/roles.h"

#include <gtest/gtest.h>

#include <string>

#include "proto/messages.h"
#include "tests/proto/proto_test_util.h"

namespace baton::proto {
namespace {

TEST(RolesTest, EveryEngineRoleRoundTrips) {
  for (EngineRole role : kEngineRoles) {
    Result<EngineRole> back = ParseEngineRole(ToString(role));
    ASSERT_TRUE(back.ok()) << ToString(role) << ": " << back.status().ToString();
    EXPECT_EQ(*back, role) << ToString(role);
  }
}

TEST(RolesTest, AnUnknownEngineRoleIsRefused) {
  Result<EngineRole> bad = ParseEngineRole("leader");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown engine role 'leader'"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(ParseEngineRole("").ok());
  EXPECT_FALSE(ParseEngineRole("Primary").ok());
}

TEST(RolesTest, EveryLaunchRoleRoundTrips) {
  for (LaunchRole role : kLaunchRoles) {
    Result<LaunchRole> back = ParseLaunchRole(ToString(role));
    ASSERT_TRUE(back.ok()) << ToString(role) << ": " << back.status().ToString();
    EXPECT_EQ(*back, role) << ToString(role);
  }
}

TEST(RolesTest, AnUnknownLaunchRoleIsRefused) {
  Result<LaunchRole> bad = ParseLaunchRole("canary");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown launch role 'canary' (primary or standby)"),
            std::string::npos)
      << bad.status().message();
}

TEST(RolesTest, EveryPeerRoleRoundTrips) {
  for (PeerRole role : kPeerRoles) {
    Result<PeerRole> back = ParsePeerRole(ToString(role));
    ASSERT_TRUE(back.ok()) << ToString(role) << ": " << back.status().ToString();
    EXPECT_EQ(*back, role) << ToString(role);
  }
}

TEST(RolesTest, AnUnknownPeerRoleIsRefused) {
  for (const char* text : {"test-helper", "", "CLI", "standby"}) {
    Result<PeerRole> bad = ParsePeerRole(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("unknown peer role '" + std::string(text) +
                                          "' (engine, cli, router, controller or drill)"),
              std::string::npos)
        << bad.status().message();
  }
}

// Hello keeps its wire format: the role is its name, as a string, where the string was.
TEST(RolesTest, AHelloCarriesItsRoleByName) {
  for (PeerRole role : kPeerRoles) {
    const Hello hello{.peer_name = "p", .role = role, .launch_token = "t"};
    Result<std::string> payload = Encode(hello);
    ASSERT_TRUE(payload.ok()) << payload.status().ToString();
    Result<std::string> as_text =
        Encode(testing::RawHello{.peer_name = "p", .role = ToString(role), .launch_token = "t"});
    ASSERT_TRUE(as_text.ok());
    EXPECT_EQ(*payload, *as_text) << ToString(role);
    Result<Hello> back = Decode<Hello>(*payload);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->role, role);
    EXPECT_EQ(back->launch_token, "t");
  }
}

TEST(RolesTest, AHelloWithAnUnknownRoleFailsTheDecode) {
  Result<std::string> payload = Encode(Hello{.peer_name = "p", .role = PeerRole::kRouter});
  ASSERT_TRUE(payload.ok());
  const size_t at = payload->find("router");
  ASSERT_NE(at, std::string::npos);
  payload->replace(at, 6, "rooter");
  Result<Hello> back = Decode<Hello>(*payload);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("unknown peer role 'rooter'"), std::string::npos)
      << back.status().message();
}

TEST(RolesTest, ARouteEntryCarriesItsRoleByName) {
  RouteTable table{.version = 3, .epoch = 2, .pair_state = "serving", .entries = {}};
  for (EngineRole role : kEngineRoles) table.entries.push_back({.engine_id = 1, .role = role});
  Result<std::string> payload = Encode(table);
  ASSERT_TRUE(payload.ok()) << payload.status().ToString();
  EXPECT_NE(payload->find("canary"), std::string::npos);
  Result<RouteTable> back = Decode<RouteTable>(*payload);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->entries, table.entries);
}

TEST(RolesTest, ARouteEntryWithAnUnknownRoleFailsTheDecode) {
  RouteTable table{.version = 1, .epoch = 1, .pair_state = "serving", .entries = {}};
  table.entries.push_back({.engine_id = 1, .role = EngineRole::kCanary});
  Result<std::string> payload = Encode(table);
  ASSERT_TRUE(payload.ok());
  const size_t at = payload->find("canary");
  ASSERT_NE(at, std::string::npos);
  payload->replace(at, 6, "cantor");
  Result<RouteTable> back = Decode<RouteTable>(*payload);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("unknown engine role 'cantor'"), std::string::npos)
      << back.status().message();
}

}  // namespace
}  // namespace baton::proto
