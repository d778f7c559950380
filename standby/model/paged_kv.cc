#include "standby/model/paged_kv.h"

#include <algorithm>

namespace baton {

Status KvLayout::Validate() const {
  if (layers < 1 || kv_heads < 1 || head_dim < 1 || block_tokens < 1) {
    return InvalidArgument(
        "kv layout: layers, kv_heads, head_dim and block_tokens must be "
        "positive (got " +
        std::to_string(layers) + ", " + std::to_string(kv_heads) + ", " + std::to_string(head_dim) +
        ", " + std::to_string(block_tokens) + ")");
  }
  const unsigned __int128 bytes = static_cast<unsigned __int128>(2) * layers * kv_heads * head_dim *
                                  block_tokens * sizeof(float);
  if (bytes > (1ull << 40)) return InvalidArgument("kv layout: block size is over 1 TiB");
  return OkStatus();
}

size_t KvLayout::block_bytes() const {
  return 2 * static_cast<size_t>(layers) * kv_heads * head_dim * block_tokens * sizeof(float);
}

Result<PagedKvCache> PagedKvCache::Create(const KvLayout& layout) {
  BATON_RETURN_IF_ERROR(layout.Validate());
  return PagedKvCache(layout);
}

Status PagedKvCache::AddBlock(KvBlockId id, void* data, size_t bytes) {
  return Insert(id, data, bytes, State::kFree);
}

Status PagedKvCache::AddHeldBlock(KvBlockId id, void* data, size_t bytes) {
  return Insert(id, data, bytes, State::kUsed);
}

Status PagedKvCache::Insert(KvBlockId id, void* data, size_t bytes, State state) {
  const std::string name = "kv block " + std::to_string(id);
  if (id > kMaxBlockId) return InvalidArgument(name + ": id above " + std::to_string(kMaxBlockId));
  if (data == nullptr || reinterpret_cast<uintptr_t>(data) % alignof(float) != 0) {
    return InvalidArgument(name + ": memory is null or not 4-byte aligned");
  }
  if (bytes < layout_.block_bytes()) {
    return InvalidArgument(name + ": " + std::to_string(bytes) + " bytes, the layout needs " +
                           std::to_string(layout_.block_bytes()));
  }
  if (id >= data_.size()) {
    data_.resize(id + 1, nullptr);
    state_.resize(id + 1, State::kAbsent);
  }
  if (state_[id] != State::kAbsent) return InvalidArgument(name + ": added twice");
  data_[id] = static_cast<float*>(data);
  state_[id] = state;
  if (state == State::kFree) free_.push_back(id);
  ++total_;
  peak_ = std::max(peak_, total_);
  return OkStatus();
}

Status PagedKvCache::AddRegion(KvBlockId first_id, void* base, size_t stride, size_t count) {
  if (count > 0 && static_cast<uint64_t>(first_id) + (count - 1) > kMaxBlockId) {
    return InvalidArgument("kv region: ids past " + std::to_string(kMaxBlockId));
  }
  for (size_t i = 0; i < count; ++i) {
    BATON_RETURN_IF_ERROR(AddBlock(static_cast<KvBlockId>(first_id + i),
                                   static_cast<uint8_t*>(base) + i * stride, stride));
  }
  return OkStatus();
}

Status PagedKvCache::RemoveBlock(KvBlockId id) {
  if (id >= state_.size() || state_[id] == State::kAbsent) {
    return NotFound("kv block " + std::to_string(id) + " is not in the cache");
  }
  if (state_[id] == State::kUsed) {
    return FailedPrecondition("kv block " + std::to_string(id) + " is held by a sequence");
  }
  free_.erase(std::find(free_.begin(), free_.end(), id));
  state_[id] = State::kAbsent;
  data_[id] = nullptr;
  --total_;
  return OkStatus();
}

int64_t PagedKvCache::BlocksFor(int64_t tokens) const {
  return (std::max<int64_t>(tokens, 0) + layout_.block_tokens - 1) / layout_.block_tokens;
}

Status PagedKvCache::Reserve(KvSequence* seq, int64_t tokens) {
  KvSequence* seqs[] = {seq};
  const int64_t lengths[] = {tokens};
  return Reserve(seqs, lengths);
}

Status PagedKvCache::Reserve(std::span<KvSequence* const> seqs, std::span<const int64_t> tokens) {
  if (seqs.size() != tokens.size()) return InvalidArgument("kv reserve: size mismatch");
  int64_t needed = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    needed +=
        std::max<int64_t>(0, BlocksFor(tokens[i]) - static_cast<int64_t>(seqs[i]->blocks.size()));
  }
  if (needed > static_cast<int64_t>(free_.size())) {
    return ResourceExhausted("kv cache: " + std::to_string(needed) + " blocks needed, " +
                             std::to_string(free_.size()) + " free of " + std::to_string(total_));
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    while (static_cast<int64_t>(seqs[i]->blocks.size()) < BlocksFor(tokens[i])) {
      const KvBlockId id = free_.front();
      free_.pop_front();
      state_[id] = State::kUsed;
      seqs[i]->blocks.push_back(id);
    }
  }
  return OkStatus();
}

void PagedKvCache::Release(KvSequence* seq) {
  for (KvBlockId id : seq->blocks) {
    if (id < state_.size() && state_[id] == State::kUsed) {
      state_[id] = State::kFree;
      free_.push_back(id);
    }
  }
  seq->blocks.clear();
  seq->length = 0;
}

}  // namespace baton
