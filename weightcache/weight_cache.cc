#include "weightcache/weight_cache.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "base/align.h"
#include "base/clock.h"
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

std::string FileName(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

// A manifest made in code (not decoded) may hold anything: every tensor inside the arena.
Status CheckTable(const WeightManifest& m) {
  for (const CachedTensor& t : m.tensors) {
    if (t.offset > m.arena_size || t.size > m.arena_size - t.offset) {
      return InvalidArgument("the manifest puts tensor '" + t.name + "' outside the arena");
    }
  }
  return OkStatus();
}

ArenaRecord RecordOf(const WeightManifest& m) {
  return ArenaRecord{.size = m.arena_size,
                     .inode = m.arena_inode,
                     .device = m.arena_device,
                     .huge_pages = m.huge_pages,
                     .first_size = m.arena_first_size,
                     .second_inode = m.arena_second_inode,
                     .second_device = m.arena_second_device,
                     .numa_node = m.numa_node,
                     .numa_bound = m.numa_bound,
                     .numa_source = m.numa_source,
                     .sealed_read_only = m.sealed_read_only};
}

}  // namespace

// Stats every file ModelFiles read, right after it validated them.
Status WeightCache::NoteSources(const ModelFiles& files) {
  BATON_ASSIGN_OR_RETURN(canonical_dir_, CanonicalPath(dir_));
  BATON_ASSIGN_OR_RETURN(dir_entries_, ListModelEntries(dir_));
  if (!files.index_path().empty()) {
    BATON_ASSIGN_OR_RETURN(FileIdentity index,
                           StatFileIdentity(dir_, FileName(files.index_path())));
    files_.push_back(std::move(index));
  }
  for (const SafetensorsIndex& shard : files.shards()) {
    BATON_ASSIGN_OR_RETURN(FileIdentity id, StatFileIdentity(dir_, FileName(shard.path())));
    if (id.size != shard.file_size()) {
      return DataLoss(shard.path() + " changed size after it was validated (" +
                      std::to_string(shard.file_size()) + " -> " + std::to_string(id.size) +
                      "); load the model again");
    }
    files_.push_back(std::move(id));
  }
  return OkStatus();
}

Result<WeightCache> WeightCache::Load(const std::string& dir, WeightCacheOptions options) {
  BATON_ASSIGN_OR_RETURN(ModelFiles files, ModelFiles::Open(dir));
  WeightCache cache;
  cache.dir_ = dir;
  BATON_RETURN_IF_ERROR(cache.NoteSources(files));
  std::vector<ShardPlace> places;
  options.arena.size = Layout(files, &places);
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
  if (std::string why = FirstChangedFile(dir, cache.files_, "while the model was loaded");
      !why.empty()) {
    return DataLoss(why + "; load the model again");
  }
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

Result<WeightCache> WeightCache::Adopt(std::vector<SharedMemory> arena,
                                       const WeightManifest& manifest,
                                       const AdoptOptions& options) {
  const TimePoint start = RealClock::Get().Now();
  if (options.model_dir.empty()) {
    return InvalidArgument("adopting a weight arena: AdoptOptions.model_dir is empty");
  }
  if (options.check_files) {
    BATON_RETURN_IF_ERROR(CheckManifestMatches(manifest, options.model_dir));
  } else if (!manifest.complete) {  // whatever the files, an arena whose load did not finish
    return FailedPrecondition("the arena's manifest is not complete: its load did not finish");
  }
  BATON_RETURN_IF_ERROR(CheckTable(manifest));
  WeightCache cache;
  BATON_ASSIGN_OR_RETURN(cache.arena_,
                         PinnedArena::Adopt(std::move(arena), RecordOf(manifest), options.lock));
  cache.dir_ = options.model_dir;
  cache.canonical_dir_ = manifest.canonical_model_dir;
  cache.files_ = manifest.files;
  cache.dir_entries_ = manifest.dir_entries;
  cache.tensors_ = manifest.tensors;
  std::sort(cache.tensors_.begin(), cache.tensors_.end(),
            [](const CachedTensor& a, const CachedTensor& b) { return a.name < b.name; });
  cache.stats_.method = "adopted";
  cache.stats_.seconds = MillisBetween(start, RealClock::Get().Now()) / 1000.0;
  BATON_LOG(INFO, kComponent) << "adopted the arena of " << options.model_dir << ": "
                              << cache.tensors_.size() << " tensors, " << cache.arena_.size()
                              << " bytes in " << cache.stats_.seconds * 1000
                              << " ms, no file read, on_2m=" << cache.arena_.huge_bytes()
                              << " on_4k=" << cache.arena_.small_bytes()
                              << " numa_node=" << cache.arena_.numa_node()
                              << " sealed=" << cache.arena_.sealed_read_only()
                              << " (mlock in the background)";
  return cache;
}

WeightManifest WeightCache::Manifest(uint64_t generation) const {
  WeightManifest m;
  m.generation = generation;
  m.complete = true;
  m.model_dir = dir_;
  m.canonical_model_dir = canonical_dir_;
  m.files = files_;
  m.dir_entries = dir_entries_;
  m.tensors = tensors_;
  m.arena_size = arena_.size();
  std::tie(m.arena_inode, m.arena_device) = arena_.identity();
  m.huge_pages = arena_.huge_pages();
  if (arena_.partial()) {
    m.arena_first_size = arena_.memory().size();
    std::tie(m.arena_second_inode, m.arena_second_device) = arena_.second_identity();
  }
  m.numa_node = arena_.numa_node();
  m.numa_bound = arena_.numa_bound();
  m.numa_source = arena_.numa_source();
  m.sealed_read_only = arena_.sealed_read_only();
  m.load = stats_;
  return m;
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
