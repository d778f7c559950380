// The names of the messages the Coordinator sends (effects.h), for its logs.
#include "controller/core/effects.h"

#include <iterator>
#include <variant>

namespace baton {

const char* ToEngineName(const ToEngine& message) {
  static constexpr const char* kNames[] = {
      "RegisterAck", "Promote",     "Grant",     "Reclaim",       "Drain",
      "Resume",      "Stop",        "ErrorMsg",  "HealthRequest", "InjectFault",
      "ReattachAck", "Quarantined", "FinalDrain"};
  static_assert(std::size(kNames) == std::variant_size_v<ToEngine>);
  return kNames[message.index()];
}

}  // namespace baton
