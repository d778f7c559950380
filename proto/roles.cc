#include "proto/roles.h"

#include <string>

namespace baton::proto {

const char* ToString(EngineRole role) {
  switch (role) {
    case EngineRole::kPrimary:
      return "primary";
    case EngineRole::kStandby:
      return "standby";
    case EngineRole::kCanary:
      return "canary";
    case EngineRole::kPromoting:
      return "promoting";
    case EngineRole::kDraining:
      return "draining";
    case EngineRole::kFencing:
      return "fencing";
    case EngineRole::kLaunching:
      return "launching";
    case EngineRole::kAdopting:
      return "adopting";
  }
  return "unknown";
}

Result<EngineRole> ParseEngineRole(std::string_view text) {
  for (EngineRole role : kEngineRoles) {
    if (text == ToString(role)) return role;
  }
  return InvalidArgument(
      "unknown engine role '" + std::string(text) +
      "' (primary, standby, canary, promoting, draining, fencing, launching or adopting)");
}

const char* ToString(LaunchRole role) {
  switch (role) {
    case LaunchRole::kPrimary:
      return "primary";
    case LaunchRole::kStandby:
      return "standby";
  }
  return "unknown";
}

Result<LaunchRole> ParseLaunchRole(std::string_view text) {
  for (LaunchRole role : kLaunchRoles) {
    if (text == ToString(role)) return role;
  }
  return InvalidArgument("unknown launch role '" + std::string(text) + "' (primary or standby)");
}

const char* ToString(PeerRole role) {
  switch (role) {
    case PeerRole::kEngine:
      return "engine";
    case PeerRole::kCli:
      return "cli";
    case PeerRole::kRouter:
      return "router";
    case PeerRole::kController:
      return "controller";
    case PeerRole::kDrill:
      return "drill";
  }
  return "unknown";
}

Result<PeerRole> ParsePeerRole(std::string_view text) {
  for (PeerRole role : kPeerRoles) {
    if (text == ToString(role)) return role;
  }
  return InvalidArgument("unknown peer role '" + std::string(text) +
                         "' (engine, cli, router, controller or drill)");
}

}  // namespace baton::proto
