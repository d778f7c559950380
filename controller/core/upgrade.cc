#include "controller/core/upgrade.h"

namespace baton {

std::string Joined(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

const char* ToString(Upgrade::Phase phase) {
  switch (phase) {
    case Upgrade::Phase::kLaunching:
      return "launching";
    case Upgrade::Phase::kReclaiming:
      return "reclaiming";
    case Upgrade::Phase::kPromoting:
      return "promoting";
    case Upgrade::Phase::kCanary:
      return "canary";
    case Upgrade::Phase::kFinishing:
      return "finishing";
    case Upgrade::Phase::kRollingBack:
      return "rolling_back";
  }
  return "unknown";
}

}  // namespace baton
