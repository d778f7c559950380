#include "standby/kv/kv_record.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

#include "base/failpoint.h"
#include "proto/wire/crc32c.h"

namespace baton {
namespace {

// The header as it lies in the block (little-endian hosts only, like the pool itself).
struct Header {
  uint32_t magic;
  uint32_t commit;
  uint64_t identity;
  uint64_t key_hi;
  uint64_t key_lo;
  uint64_t writer_epoch;
  uint32_t block;
  uint32_t prev_block;
  uint32_t index;
  uint32_t tokens;
  uint32_t crc;
  uint32_t reserved;
};
static_assert(sizeof(Header) == kKvRecordHeaderBytes);
constexpr size_t kCrcBegin = offsetof(Header, identity);
constexpr size_t kCrcEnd = offsetof(Header, crc);

uint32_t RecordCrc(const Header& h, const uint8_t* ids, uint32_t tokens) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(&h);
  const uint32_t crc = proto::Crc32c(bytes + kCrcBegin, kCrcEnd - kCrcBegin);
  return proto::Crc32cExtend(crc, ids, size_t{tokens} * sizeof(int32_t));
}

}  // namespace

uint64_t KvDataOffset(int block_tokens) {
  const uint64_t ids = uint64_t{static_cast<uint32_t>(block_tokens)} * sizeof(int32_t);
  return kKvRecordHeaderBytes + (ids + 63) / 64 * 64;
}

int KvBlockTokensFor(uint64_t block_bytes, uint64_t kv_bytes_per_token) {
  if (kv_bytes_per_token == 0 || block_bytes <= kKvRecordHeaderBytes) return 0;
  uint64_t tokens = (block_bytes - kKvRecordHeaderBytes) / (kv_bytes_per_token + sizeof(int32_t));
  tokens = std::min<uint64_t>(tokens, 1 << 20);
  while (tokens > 0 &&
         KvDataOffset(static_cast<int>(tokens)) + tokens * kv_bytes_per_token > block_bytes) {
    --tokens;
  }
  return static_cast<int>(tokens);
}

uint64_t KvIdentityOf(std::string_view description) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : description) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

void CommitKvRecord(uint8_t* block, const KvBlockRecord& r, std::span<const int32_t> ids) {
  auto* h = reinterpret_cast<Header*>(block);
  std::atomic_ref<uint32_t> commit(h->commit);
  // Stable fields first: a record torn below still names its request.
  h->identity = r.identity;
  h->key_hi = r.key.hi;
  h->key_lo = r.key.lo;
  h->block = r.block;
  h->prev_block = r.prev_block;
  h->index = r.index;
  const uint32_t before = commit.load(std::memory_order_relaxed) & ~1u;
  commit.store(before + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  h->writer_epoch = r.writer_epoch;
  h->tokens = static_cast<uint32_t>(ids.size());
  std::memcpy(block + kKvRecordHeaderBytes, ids.data(), ids.size_bytes());
  BATON_FAILPOINT("kv_mid_commit");
  h->crc = RecordCrc(*h, block + kKvRecordHeaderBytes, h->tokens);
  h->magic = kKvRecordMagic;
  commit.store(before + 2, std::memory_order_release);
}

void ClearKvRecord(uint8_t* block) { std::memset(block, 0, kKvRecordHeaderBytes); }

const char* ToString(KvRecordState state) {
  switch (state) {
    case KvRecordState::kAbsent:
      return "absent";
    case KvRecordState::kTorn:
      return "torn";
    case KvRecordState::kCorrupt:
      return "corrupt";
    case KvRecordState::kValid:
      return "valid";
  }
  return "?";
}

bool KvRecordPresent(const uint8_t* header) {
  Header h;
  std::memcpy(&h, header, sizeof(h));
  return !KvRequestKey{h.key_hi, h.key_lo}.empty();
}

KvRecordRead ReadKvRecord(const uint8_t* header, const uint8_t* ids_area, int block_tokens) {
  Header h;
  std::memcpy(&h, header, sizeof(h));
  KvRecordRead out;
  out.record = {.identity = h.identity,
                .key = {h.key_hi, h.key_lo},
                .writer_epoch = h.writer_epoch,
                .block = h.block,
                .prev_block = h.prev_block,
                .index = h.index,
                .tokens = h.tokens};
  if (out.record.key.empty()) return out;
  if ((h.commit & 1u) != 0 || h.magic != kKvRecordMagic) {
    out.state = KvRecordState::kTorn;
    return out;
  }
  if (h.tokens == 0 || h.tokens > static_cast<uint32_t>(block_tokens) ||
      RecordCrc(h, ids_area, h.tokens) != h.crc) {
    out.state = KvRecordState::kCorrupt;
    return out;
  }
  out.ids.resize(h.tokens);
  std::memcpy(out.ids.data(), ids_area, out.ids.size() * sizeof(int32_t));
  out.state = KvRecordState::kValid;
  return out;
}

}  // namespace baton
