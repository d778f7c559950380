// The messages of KV-warm failover (docs/architecture.md): which blocks of its predecessor a
// promoted engine may read before their barrier, how it took the KV they hold, and what it
// adopted. Part of proto/messages.h, which includes it where these types are needed; include
// that header, not this one.
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

// Controller -> engine (protocol 7 and up), right before the Promote of a promotion that does
// not wait for the predecessor's barrier: `extents` are the predecessor's blocks, quarantined
// until its barrier has passed (its process, or its GPU work, may still write them). The
// engine may map them read-only and copy KV out of them into its own blocks, checking every
// record it keeps again after the copy; it never maps them writable. Once the barrier has
// passed they come to it in a Grant at the same epoch. `barrier_estimate_us`: how long the
// controller expects the barrier to take still (from its recent teardowns);
// `wait_limit_ms`: the longest the engine may hold its PromoteAck back waiting for them.
struct Quarantined {
  static constexpr MsgType kType = MsgType::kQuarantined;
  uint64_t epoch = 0;
  std::vector<BlockRange> extents = {};
  uint32_t barrier_estimate_us = 0;
  uint32_t wait_limit_ms = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, extents, barrier_estimate_us, wait_limit_ms);
  }
};

// How a promoted engine took its predecessor's committed KV (KvInherited::mode).
enum class KvInheritMode : uint8_t {
  kNone = 0,    // nothing to take (no quarantined block held a committed sequence)
  kCopied = 1,  // copied out of the quarantined blocks before their barrier
  kWaited = 2,  // copying would have cost more than the barrier: adopted in place after it
};

// Engine -> controller (protocol 7 and up), once after a Quarantined: how it took the committed
// KV of the quarantined blocks (mode: KvInheritMode), the blocks and bytes that held it, the
// time its copy took (or the wait for the barrier), and the copy it had estimated.
struct KvInherited {
  static constexpr MsgType kType = MsgType::kKvInherited;
  uint64_t epoch = 0;
  uint8_t mode = 0;
  uint32_t blocks = 0;
  uint64_t bytes = 0;
  uint32_t micros = 0;
  uint32_t estimate_us = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, mode, blocks, bytes, micros, estimate_us);
  }
};

}  // namespace baton::proto
