// KV records: what the reference engine leaves in every pool block a sequence fills, so that
// a successor that inherits the block (a failover, a switch-over) can continue the sequence
// from its KV instead of prefilling it again.
//
// A pool block of the reference engine is laid out as
//
//   [0, 64)                 the record header (the SDK's block header, kBlockHeaderBytes)
//   [64, data_offset)       the token ids of the block's slots: int32 each, block_tokens of
//                           them, the area rounded up to 64 bytes
//   [data_offset, end)      the KV data (PagedKvCache's layout)
//
// The header names the request the block belongs to (the router's 128-bit request key), the
// block's place in the sequence (its index and the block before it), how many slots hold
// complete K and V, the epoch of the engine that wrote it, and an identity of the model and
// KV layout. It is a seqlock: the writer sets the commit counter odd, writes the fields and
// the ids, then a CRC32C over them, then sets the counter even. The stable fields (identity,
// key, block, index, previous block) are written before the counter goes odd, so a record
// torn mid-commit still says whose it was. The engine commits a block's record only after
// the step whose K and V it describes has written them, so a reader after the writer's death
// (killed and reaped: every store is complete) sees the last committed step or the one
// before it, never a claim to KV that was not written.
//
// Pure functions over memory; the caller serializes writers of one block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "standby/model/kv_hooks.h"

namespace baton {

inline constexpr uint32_t kKvRecordMagic = 0x3156'4B42;  // "BKV1"
inline constexpr uint32_t kKvNoBlock = 0xFFFF'FFFF;
inline constexpr uint64_t kKvRecordHeaderBytes = 64;

// Bytes from the start of a block to its KV data, for `block_tokens` slots.
uint64_t KvDataOffset(int block_tokens);
// The most slots of `kv_bytes_per_token` bytes each (with their token ids) that fit in a
// block of `block_bytes` bytes; 0 when not even one does.
int KvBlockTokensFor(uint64_t block_bytes, uint64_t kv_bytes_per_token);
// A 64-bit identity of a model and KV layout from its description (FNV-1a).
uint64_t KvIdentityOf(std::string_view description);

struct KvBlockRecord {
  uint64_t identity = 0;
  KvRequestKey key;
  uint64_t writer_epoch = 0;
  uint32_t block = 0;                // the pool block the record is in
  uint32_t prev_block = kKvNoBlock;  // the sequence's block before this one
  uint32_t index = 0;                // this block's place in the sequence's block table
  uint32_t tokens = 0;               // slots from 0 whose K and V are complete
};

// Writes `record` and the ids of its `tokens` slots into `block` (its first
// KvDataOffset(block_tokens) bytes). ids.size() == record.tokens <= block_tokens.
void CommitKvRecord(uint8_t* block, const KvBlockRecord& record, std::span<const int32_t> ids);
// Zeroes the header: the block holds no record (a block going back to the free list).
void ClearKvRecord(uint8_t* block);

enum class KvRecordState {
  kAbsent,   // no record (a zero key)
  kTorn,     // the writer died mid-commit (the counter is odd, or the first commit did not end)
  kCorrupt,  // the checksum does not match, or a field is out of range
  kValid,
};
const char* ToString(KvRecordState state);

struct KvRecordRead {
  KvRecordState state = KvRecordState::kAbsent;
  KvBlockRecord record;      // the stable fields even when torn; all of it when valid
  std::vector<int32_t> ids;  // kValid: the ids of record.tokens slots
};

// True when the header (kKvRecordHeaderBytes) names a record, whole or not: reading it needs
// the block's token id area too (ReadKvRecord).
bool KvRecordPresent(const uint8_t* header);

// Reads the record of a block from a copy of its header (`header`, kKvRecordHeaderBytes)
// and its token id area (`ids_area`, 4 x block_tokens bytes).
KvRecordRead ReadKvRecord(const uint8_t* header, const uint8_t* ids_area, int block_tokens);

}  // namespace baton
