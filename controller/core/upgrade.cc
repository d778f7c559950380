#include "controller/core/upgrade.h"

namespace baton {

std::string Joined(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

}  // namespace baton
