// KvHooks: how the Generator lets an engine keep a sequence's KV for a successor.
//
// An engine that hands its KV blocks to the next engine (KV-warm failover, docs/
// architecture.md) writes, after each step, a record of what each block holds (Committed),
// clears it before the block is freed (Releasing), and at admission may give a request the
// blocks that already hold the K and V of its first tokens (Continue): the Generator then
// prefills only the rest. Evict() frees blocks kept that way when the cache runs short, and
// Park() takes over the blocks of a running sequence that is handed to another engine.
//
// Called on the Generator's compute thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "standby/model/paged_kv.h"

namespace baton {

// The router's key of one client request, the same on every attempt (docs/router.md).
struct KvRequestKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  bool empty() const { return hi == 0 && lo == 0; }
  bool operator==(const KvRequestKey& o) const { return hi == o.hi && lo == o.lo; }
  bool operator<(const KvRequestKey& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
  // 32 lowercase hex digits.
  std::string ToHex() const;
  // Parses 32 hex digits (either case); nullopt for anything else, or for the all-zero key.
  static std::optional<KvRequestKey> FromHex(std::string_view text);
};

struct GenerationRequest;

class KvHooks {
 public:
  virtual ~KvHooks() = default;
  // After a step: `kv` holds the K and V of tokens[0, kv.length), and held those of
  // tokens[0, before) before the step.
  virtual void Committed(const GenerationRequest& request, const KvSequence& kv,
                         std::span<const int32_t> tokens, int64_t before) = 0;
  // `kv`'s blocks are about to go back to the cache's free list.
  virtual void Releasing(const KvSequence& kv) = 0;
  // Admission of `request` (input `tokens`, kv empty): may fill `kv` with blocks that
  // already hold the K and V of tokens[0, n), n < tokens.size(), and return n; 0 if none.
  virtual int64_t Continue(const GenerationRequest& request, std::span<const int32_t> tokens,
                           KvSequence* kv) = 0;
  // The cache lacks `blocks` free blocks: frees blocks kept for requests not yet back.
  virtual void Evict(size_t blocks) = 0;
  // Takes over the blocks of a running sequence handed to another engine: `kv` holds the K
  // and V of tokens[0, kv.length); it is left empty, its blocks kept (not freed).
  virtual void Park(const GenerationRequest& request, KvSequence* kv,
                    std::span<const int32_t> tokens) = 0;
};

}  // namespace baton
