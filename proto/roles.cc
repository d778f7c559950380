#include "proto/roles.h"

#include <iterator>

#include "base/text/enum_names.h"

namespace baton::proto {
namespace {

constexpr EnumNames<EngineRole, 8> kEngineRoleNames{"engine role",
                                                    {{{EngineRole::kPrimary, "primary"},
                                                      {EngineRole::kStandby, "standby"},
                                                      {EngineRole::kCanary, "canary"},
                                                      {EngineRole::kPromoting, "promoting"},
                                                      {EngineRole::kDraining, "draining"},
                                                      {EngineRole::kFencing, "fencing"},
                                                      {EngineRole::kLaunching, "launching"},
                                                      {EngineRole::kAdopting, "adopting"}}}};
static_assert(kEngineRoleNames.entries.size() == std::size(kEngineRoles));

constexpr EnumNames<LaunchRole, 2> kLaunchRoleNames{
    "launch role", {{{LaunchRole::kPrimary, "primary"}, {LaunchRole::kStandby, "standby"}}}};
static_assert(kLaunchRoleNames.entries.size() == std::size(kLaunchRoles));

constexpr EnumNames<PeerRole, 5> kPeerRoleNames{"peer role",
                                                {{{PeerRole::kEngine, "engine"},
                                                  {PeerRole::kCli, "cli"},
                                                  {PeerRole::kRouter, "router"},
                                                  {PeerRole::kController, "controller"},
                                                  {PeerRole::kDrill, "drill"}}}};
static_assert(kPeerRoleNames.entries.size() == std::size(kPeerRoles));

}  // namespace

const char* ToString(EngineRole role) { return kEngineRoleNames.Name(role); }
Result<EngineRole> ParseEngineRole(std::string_view text) { return kEngineRoleNames.Parse(text); }

const char* ToString(LaunchRole role) { return kLaunchRoleNames.Name(role); }
Result<LaunchRole> ParseLaunchRole(std::string_view text) { return kLaunchRoleNames.Parse(text); }

const char* ToString(PeerRole role) { return kPeerRoleNames.Name(role); }
Result<PeerRole> ParsePeerRole(std::string_view text) { return kPeerRoleNames.Parse(text); }

}  // namespace baton::proto
