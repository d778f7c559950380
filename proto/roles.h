// Engine roles, as the route table, `batonctl status`, the fleet's etcd records and the
// engine's launch arguments name them. In memory they are these enums; the text is made only
// where a message, a JSON document, a log line or a command line is written or read.
//
// EngineRole: what an engine is to its pair now. The route table uses kPrimary, kStandby,
// kCanary, kPromoting and kDraining; status adds kFencing, kLaunching and kAdopting.
// LaunchRole: what an engine is started as ({role}, BATON_ROLE, `--role`).
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

}  // namespace baton::proto
