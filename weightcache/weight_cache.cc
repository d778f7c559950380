#include "weightcache/weight_cache.h"

#include <sys/stat.h>

#include <algorithm>

#include "base/align.h"
#include "base/log.h"

namespace baton {
namespace {

constexpr char kComponent[] = "weightcache";
constexpr uint64_t kAlign = kDirectIoAlignment;

uint64_t AlignUp(uint64_t v) { return RoundUp(v, kAlign); }
uint64_t AlignDown(uint64_t v) { return v / kAlign * kAlign; }

// Where one shard goes: its bytes from `file_offset` to end of file land at `arena_offset`.
struct ShardPlace {
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint64_t arena_offset = 0;
  uint64_t data_base = 0;  // arena offset of the shard's data section byte 0
};

// Lays shards out one after another at 4096-aligned arena offsets; returns the arena size.
uint64_t Layout(const ModelFiles& files, std::vector<ShardPlace>* places) {
  uint64_t cursor = 0;
  for (const SafetensorsIndex& shard : files.shards()) {
    ShardPlace p;
    p.file_offset = AlignDown(shard.data_offset());
    p.length = shard.file_size() - p.file_offset;
    p.arena_offset = cursor;
    p.data_base = cursor + (shard.data_offset() - p.file_offset);
    places->push_back(p);
    cursor = AlignUp(cursor + p.length);
  }
  return std::max(cursor, kAlign);
}

// The loader reads each shard up to its end of file as it finds it, so a shard truncated or
// replaced after it was validated would load short, its tail as zeros: refused here.
Status CheckComplete(const ModelFiles& files, const std::vector<ShardPlace>& places,
                     uint64_t bytes_read) {
  uint64_t expected = 0;
  for (const ShardPlace& p : places) expected += p.length;
  if (bytes_read == expected) return OkStatus();
  std::string changed;
  for (const SafetensorsIndex& shard : files.shards()) {
    struct stat st {};
    if (::stat(shard.path().c_str(), &st) != 0 ||
        static_cast<uint64_t>(st.st_size) != shard.file_size()) {
      changed += (changed.empty() ? "" : ", ") + shard.path();
    }
  }
  return DataLoss("read " + std::to_string(bytes_read) + " of " + std::to_string(expected) +
                  " bytes: " + (changed.empty() ? "a shard" : changed) +
                  " changed size after it was validated; load the model again");
}

}  // namespace

Result<WeightCache> WeightCache::Load(const std::string& dir, WeightCacheOptions options) {
  BATON_ASSIGN_OR_RETURN(ModelFiles files, ModelFiles::Open(dir));
  std::vector<ShardPlace> places;
  options.arena.size = Layout(files, &places);

  WeightCache cache;
  cache.dir_ = dir;
  BATON_ASSIGN_OR_RETURN(cache.arena_, PinnedArena::Create(options.arena));

  std::vector<ReadJob> jobs;
  for (size_t i = 0; i < places.size(); ++i) {
    const ShardPlace& p = places[i];
    jobs.push_back(ReadJob{files.shards()[i].path(), p.file_offset, p.length,
                           cache.arena_.data() + p.arena_offset});
    for (const TensorInfo& t : files.shards()[i].tensors()) {
      cache.tensors_.push_back(
          CachedTensor{t.name, t.dtype, t.shape, p.data_base + t.begin, t.size()});
    }
  }
  std::sort(cache.tensors_.begin(), cache.tensors_.end(),
            [](const CachedTensor& a, const CachedTensor& b) { return a.name < b.name; });

  UringLoader loader(options.load);
  auto stats = loader.Load(jobs, cache.arena_.data(), cache.arena_.size());
  if (!stats.ok()) return stats.status().WithContext("loading " + dir);
  cache.stats_ = std::move(stats).value();
  BATON_RETURN_IF_ERROR(CheckComplete(files, places, cache.stats_.bytes));
  cache.arena_.SealReadOnly();

  const PinnedArena& a = cache.arena_;
  BATON_LOG(INFO, kComponent) << "loaded " << dir << ": " << cache.tensors_.size() << " tensors, "
                              << cache.stats_.bytes << " bytes in " << cache.stats_.seconds
                              << " s, " << cache.stats_.gbps
                              << " GB/s, method=" << cache.stats_.method
                              << " huge_pages=" << a.huge_pages() << " numa_node=" << a.numa_node()
                              << " locked=" << a.locked();
  return cache;
}

const CachedTensor* WeightCache::Find(const std::string& name) const {
  auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const CachedTensor& t, const std::string& n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

uint64_t WeightCache::tensor_bytes() const {
  uint64_t total = 0;
  for (const CachedTensor& t : tensors_) total += t.size;
  return total;
}

}  // namespace baton
