// Roles, as the route table, `batonctl status`, the fleet's etcd records, the engine's launch
// arguments and Hello name them. In memory they are these enums; the text is made only where
// a message, a JSON document, a log line or a command line is written or read.
//
// EngineRole: what an engine is to its pair now. The route table uses kPrimary, kStandby,
// kCanary, kPromoting and kDraining; status adds kFencing, kLaunching and kAdopting.
// LaunchRole: what an engine is started as ({role}, BATON_ROLE, `--role`), and what a peer
// of the GPU promotion drill is started as (cuda/drill/device_drill.h).
// PeerRole: what the client of a connection says it is in its Hello (proto/hello.h).
//
// Plain values; any thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace baton::proto {

enum class EngineRole : uint8_t {
  kPrimary,
  kStandby,
  kCanary,
  kPromoting,
  kDraining,
  kFencing,
  kLaunching,
  kAdopting,
};
inline constexpr EngineRole kEngineRoles[] = {
    EngineRole::kPrimary,  EngineRole::kStandby, EngineRole::kCanary,    EngineRole::kPromoting,
    EngineRole::kDraining, EngineRole::kFencing, EngineRole::kLaunching, EngineRole::kAdopting};

// "primary", "standby", "canary", "promoting", "draining", "fencing", "launching",
// "adopting".
const char* ToString(EngineRole role);
// The role named `text`; InvalidArgument naming it when it names none.
Result<EngineRole> ParseEngineRole(std::string_view text);

enum class LaunchRole : uint8_t { kPrimary, kStandby };
inline constexpr LaunchRole kLaunchRoles[] = {LaunchRole::kPrimary, LaunchRole::kStandby};

// "primary", "standby".
const char* ToString(LaunchRole role);
// The launch role named `text`; InvalidArgument naming it when it names none.
Result<LaunchRole> ParseLaunchRole(std::string_view text);

enum class PeerRole : uint8_t {
  kEngine,      // an engine's SDK: registers with its launch token
  kCli,         // batonctl: CtlRequests
  kRouter,      // a router: Subscribe, then route tables
  kController,  // the controller, to baton-keeper
  kDrill,       // a peer of the GPU promotion drill, to the drill's owner
};
inline constexpr PeerRole kPeerRoles[] = {PeerRole::kEngine, PeerRole::kCli, PeerRole::kRouter,
                                          PeerRole::kController, PeerRole::kDrill};

// "engine", "cli", "router", "controller", "drill".
const char* ToString(PeerRole role);
// The peer role named `text`; InvalidArgument naming it when it names none.
Result<PeerRole> ParsePeerRole(std::string_view text);

}  // namespace baton::proto
