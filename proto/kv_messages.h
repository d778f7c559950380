// The message of KV-warm failover (docs/architecture.md): what a promoted engine adopted of
// the KV its predecessor left in the blocks handed to it. Part of proto/messages.h, which
// includes it where these types are needed; include that header, not this one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace baton::proto {

// Engine -> controller (protocol 6 and up), once after a Promote: the sequences it adopted
// (and the tokens whose K and V they hold) and those it dropped, by reason (parallel
// vectors), and how long reading the records took. Shown in the promotion's timeline.
struct KvAdopted {
  static constexpr MsgType kType = MsgType::kKvAdopted;
  uint64_t epoch = 0;
  uint32_t adopted = 0;
  uint64_t tokens = 0;
  std::vector<std::string> dropped_reasons = {};
  std::vector<uint32_t> dropped_counts = {};
  uint32_t micros = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, adopted, tokens, dropped_reasons, dropped_counts, micros);
  }
};

}  // namespace baton::proto
