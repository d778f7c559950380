// Controller: the weights, the pool and, on the CUDA backend, the device memory.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/io/self_exe.h"
#include "base/log.h"
#include "controller/controller.h"
#include "controller/keeper/keeper_client.h"
#include "controller/kept_memory.h"
#include "weightcache/file_identity.h"
#include "weightcache/weight_manifest.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";
// A device that does not finish a 4-byte copy in this long is taken as lost (hung).
constexpr Duration kDeviceProbeTimeout = std::chrono::seconds(2);

}  // namespace

Status Controller::SetUpMemory(const BackendChoice& backend, BackendMode mode) {
  std::optional<KeeperClient> keeper = ConnectKeeper();
  const std::optional<MemoryRecord> record = LoadKeptRecord(keeper.has_value());
  MemoryRecord kept = record.value_or(MemoryRecord{});
  BATON_ASSIGN_OR_RETURN(const std::string weights_why, SetUpWeights(keeper, record));
  std::string pool_why = AdoptPool(keeper, record);
  if (!found_.roster.has_value() && (weights_why.empty() || pool_why.empty())) {
    // A writer nobody accounts for may outlive the wait: the pool is then made anew (the
    // weights are sealed read-only for every process: they stay).
    const std::string held = WhyKeptPoolIsUnsafe(backend, weights_why.empty(), pool_why.empty());
    if (!held.empty() && pool_why.empty()) {
      pool_adopted_ = false;
      pool_why = held;
    }
  }
  if (!pool_why.empty()) {
    if (keeper.has_value()) BATON_LOG(INFO, kLog) << "pool: made anew (" << pool_why << ")";
    BATON_RETURN_IF_ERROR(MakePool());
  }
  if (keeper.has_value()) KeepMemory(*keeper, weights_why.empty(), pool_why.empty(), &kept);
  memory_record_ = kept;
  // No keeper keeps this memory: a record naming a previous keeper's would have the next
  // controller adopt memory that the engines no longer map, should that keeper come back.
  if (!keeper.has_value() && config_.keep_memory) SaveRecord();
  BATON_ASSIGN_OR_RETURN(const std::string weights_note,
                         SetUpDeviceOverHost(backend, mode, keeper.has_value() ? &*keeper : nullptr,
                                             weights_why, pool_why.empty()));
  found_.cuda_backend = cuda_backend_;
  NoteDeviceChunks();
  NoteMemoryIdentity(weights_note, pool_why);
  BATON_LOG(INFO, kLog) << "pool: " << config_.block_count << " blocks of " << config_.block_bytes
                        << " bytes, huge_pages=" << pool_.huge_pages()
                        << (pool_adopted_ ? ", adopted" : "");
  return OkStatus();
}

std::optional<MemoryRecord> Controller::LoadKeptRecord(bool keeper) const {
  if (!keeper) return std::nullopt;
  Result<std::optional<MemoryRecord>> loaded = LoadMemoryRecord(config_.memory_record_path());
  if (!loaded.ok()) {
    BATON_LOG(WARN, kLog) << "ignoring the memory record: " << loaded.status().message();
    return std::nullopt;
  }
  return *loaded;
}

std::string Controller::WhyKeptPoolIsUnsafe(const BackendChoice& backend, bool weights_adopted,
                                            bool pool_adopted) {
  std::string held = ClearHoldersOfKeptMemory(weights_adopted, pool_adopted);
  if (held.empty() && !found_.holders_killed.empty() && backend.kind == MemoryBackendKind::kCuda) {
    // Their GPU work is not awaited here (the barrier's NVML check is not loaded yet): the
    // device memory is made anew, and the pool whose records describe it with it.
    held = "killed processes that held the kept memory may still run GPU work";
  }
  return held;
}

Result<std::string> Controller::SetUpDeviceOverHost(const BackendChoice& backend, BackendMode mode,
                                                    KeeperClient* keeper,
                                                    const std::string& weights_why,
                                                    bool pool_adopted) {
  Status device = SetUpDeviceMemory(backend, mode, keeper, weights_why.empty() && pool_adopted);
  if (backend.kind != MemoryBackendKind::kCuda || device_ != nullptr || !weights_why.empty()) {
    BATON_RETURN_IF_ERROR(device);
    return weights_why;
  }
  // The device copy could not be made over the adopted arena (which this controller maps
  // read-only and pins READ_ONLY, or copies from pageable memory where it cannot): the
  // weights are loaded afresh and the copy made as at a first start.
  BATON_LOG(WARN, kLog) << "device memory over the adopted weights failed ("
                        << (device.ok() ? "fell back to the host backend" : device.message())
                        << "): loading the weights afresh";
  BATON_RETURN_IF_ERROR(LoadWeights());
  if (keeper != nullptr) {  // the kept weights are not these: keep the ones the copy is of
    KeepMemory(*keeper, /*weights_adopted=*/false, /*pool_adopted=*/true, &memory_record_);
  }
  BATON_RETURN_IF_ERROR(SetUpDeviceMemory(backend, mode, keeper, /*host_adopted=*/false));
  return std::string("the device copy could not be made over the adopted arena");
}

void Controller::NoteDeviceChunks() {
  if (device_ == nullptr) return;
  // Engines map the device pool by whole chunks.
  const uint64_t chunk = device_->stats().pool_chunk_bytes;
  found_.blocks_per_chunk = static_cast<uint32_t>(chunk / config_.block_bytes);
  const uint64_t pool_bytes = uint64_t{config_.block_count} * config_.block_bytes;
  if (chunk != config_.gpu_pool_chunk_bytes && chunk < pool_bytes) {  // not the pool's size
    BATON_LOG(INFO, kLog) << "device pool chunks of " << chunk << " bytes: gpu.pool_chunk_bytes "
                          << config_.gpu_pool_chunk_bytes
                          << " rounded to whole blocks on the device's allocation "
                             "granularity (at least one such unit)";
  }
}

std::optional<KeeperClient> Controller::ConnectKeeper() {
  if (!config_.keep_memory) {
    keeper_state_ = "controller.keep_memory = false";
    // A keeper a previous controller left (it kept memory) would hold it for nobody.
    if (Result<KeeperClient> left = KeeperClient::Connect(config_.keeper_socket_path(), "", "");
        left.ok()) {
      const Result<pid_t> pid = left->KeeperPid();
      const Status released = left->Release("");
      BATON_LOG(WARN, kLog) << "baton-keeper (pid " << (pid.ok() ? *pid : 0)
                            << ") of a previous controller kept its memory, and "
                               "controller.keep_memory is false: "
                            << (released.ok() ? "let go" : "not let go: " + released.ToString());
    }
    return std::nullopt;
  }
  const std::string binary = KeeperClient::DefaultBinary();
  Result<KeeperClient> keeper = KeeperClient::Connect(config_.keeper_socket_path(), binary,
                                                      config_.runtime_dir + "/keeper.log");
  if (!keeper.ok()) {
    keeper_state_ = "unavailable: " + (binary.empty() ? "no executable baton-keeper beside " +
                                                            SelfExePath() + " and none running"
                                                      : keeper.status().message());
    BATON_LOG(WARN, kLog) << "baton-keeper " << keeper_state_
                          << ": the weights and the pool die with this controller";
    return std::nullopt;
  }
  keeper_state_ = "kept";
  Result<pid_t> pid = keeper->KeeperPid();
  keeper_pid_ = pid.ok() ? *pid : 0;
  return std::move(keeper).value();
}

std::string Controller::AdoptPool(std::optional<KeeperClient>& keeper,
                                  const std::optional<MemoryRecord>& record) {
  if (!keeper.has_value()) return keeper_state_;
  Result<std::optional<KeptItem>> item = keeper->Fetch("pool");
  if (!item.ok()) return "fetching the kept pool: " + item.status().message();
  if (!item->has_value()) return "no pool is kept";
  if (!record.has_value()) return "no memory record in the state directory";
  Result<PoolManifest> manifest = DecodePoolManifest((*item)->manifest, "the kept pool's manifest");
  if (!manifest.ok()) return manifest.status().message();
  if (manifest->generation != record->pool_generation) {
    return "the kept pool is not the one the memory record names";
  }
  if ((*item)->fds.size() != 1) return "the kept pool has no memfd";
  Result<SharedMemory> pool = SharedMemory::Import(std::move((*item)->fds[0]));
  if (!pool.ok()) return pool.status().message();
  if (const std::string why =
          PoolMismatch(*manifest, config_.block_count, config_.block_bytes, pool->size());
      !why.empty()) {
    return why;
  }
  pool_ = std::move(pool).value();
  pool_adopted_ = true;
  pool_generation_ = manifest->generation;
  return "";
}

void Controller::KeepMemory(KeeperClient& keeper, bool weights_adopted, bool pool_adopted,
                            MemoryRecord* record) {
  const MemoryRecord before = *record;
  if (!weights_adopted) {
    Result<uint64_t> generation = NewGeneration();
    Status kept = generation.status();
    if (generation.ok()) {
      Result<std::vector<UniqueFd>> fds = weights_->arena().DupFds();
      std::vector<int> raw;
      if (fds.ok()) {
        for (const UniqueFd& fd : *fds) raw.push_back(fd.get());
      }
      kept = fds.ok() ? keeper.Keep("weights",
                                    EncodeWeightManifest(weights_->Manifest(*generation)), raw)
                      : fds.status();
    }
    record->weights_generation = kept.ok() ? *generation : 0;
    if (!kept.ok()) BATON_LOG(WARN, kLog) << "weights not kept: " << kept.ToString();
  }
  if (!pool_adopted) {
    Result<uint64_t> generation = NewGeneration();
    Status kept = generation.status();
    if (generation.ok()) {
      const PoolManifest m{.block_count = config_.block_count,
                           .block_bytes = config_.block_bytes,
                           .bytes = pool_.size(),
                           .huge_pages = pool_.huge_pages(),
                           .generation = *generation};
      Result<UniqueFd> fd = pool_.Dup();
      kept = fd.ok() ? keeper.Keep("pool", EncodePoolManifest(m), {fd->get()}) : fd.status();
    }
    record->pool_generation = kept.ok() ? *generation : 0;
    if (!kept.ok()) BATON_LOG(WARN, kLog) << "pool not kept: " << kept.ToString();
  }
  if (*record == before) return;
  if (Status saved = SaveMemoryRecord(config_.memory_record_path(), *record); !saved.ok()) {
    BATON_LOG(WARN, kLog) << "the memory record is not saved (a restarted controller will load "
                             "the model again): "
                          << saved.ToString();
  }
}

Result<std::string> Controller::SetUpWeights(std::optional<KeeperClient>& keeper,
                                             const std::optional<MemoryRecord>& record) {
  const std::string why = AdoptWeights(keeper, record);
  if (why.empty()) return why;
  if (keeper.has_value()) BATON_LOG(INFO, kLog) << "weights: loading (" << why << ")";
  Status loaded = LoadWeights();
  if (loaded.ok()) return why;
  // The files changed since the kept arena was loaded and no longer load: the engines that
  // serve map that arena, and it is intact. Taking it keeps them (and a failover) serving.
  if (!keeper.has_value() || !AdoptWeights(keeper, record, /*files_may_differ=*/true).empty()) {
    return loaded;
  }
  weights_files_ = "the model files changed (" + why + ") and do not load (" + loaded.message() +
                   "): the kept weights, as loaded before, serve on until the files load";
  BATON_LOG(ERROR, kLog) << "weights: " << weights_files_;
  return std::string();
}

std::string Controller::AdoptWeights(std::optional<KeeperClient>& keeper,
                                     const std::optional<MemoryRecord>& record,
                                     bool files_may_differ) {
  if (!keeper.has_value()) return keeper_state_;
  Result<std::optional<KeptItem>> item = keeper->Fetch("weights");
  if (!item.ok()) return "fetching the kept weights: " + item.status().message();
  if (!item->has_value()) return "no weights are kept";
  if (!record.has_value()) return "no memory record in the state directory";
  Result<WeightManifest> manifest =
      DecodeWeightManifest((*item)->manifest, "the kept weights' manifest");
  if (!manifest.ok()) return manifest.status().message();
  if (manifest->generation != record->weights_generation) {
    return "the kept weights are not the ones the memory record names";
  }
  if (!files_may_differ) {
    if (Status same = CheckManifestMatches(*manifest, config_.model_dir); !same.ok()) {
      return same.message();
    }
  } else if (Result<std::string> canonical = CanonicalPath(config_.model_dir);
             !canonical.ok() || *canonical != manifest->canonical_model_dir) {
    // The files may differ, the folder may not: another model is no fallback.
    return "the model directory is not the one the kept weights were loaded from (" +
           manifest->canonical_model_dir + ")";
  }
  if ((*item)->fds.empty()) return "the kept weights have no memfd";
  Result<std::vector<SharedMemory>> arena = ImportArenaFds(std::move((*item)->fds));
  if (!arena.ok()) return arena.status().message();
  Result<WeightCache> cache = WeightCache::Adopt(std::move(arena).value(), *manifest,
                                                 AdoptOptions{.model_dir = config_.model_dir,
                                                              .check_files = !files_may_differ,
                                                              .lock = config_.weights_lock});
  if (!cache.ok()) return cache.status().message();
  weights_.emplace(std::move(cache).value());
  BATON_LOG(INFO, kLog) << "weights adopted from baton-keeper: " << weights_->tensors().size()
                        << " tensors, " << weights_->arena().size() << " bytes ("
                        << weights_->arena().huge_bytes() << " on 2 MiB pages, "
                        << weights_->arena().small_bytes()
                        << " on 4 KiB pages); not one byte read from the model files";
  return "";
}

bool Controller::ReleaseKeptMemory() {
  if (!config_.keep_memory) return true;
  Result<KeeperClient> keeper = KeeperClient::Connect(config_.keeper_socket_path(), "", "");
  Status released = keeper.ok() ? keeper->Release("") : keeper.status();
  if (!released.ok()) {
    BATON_LOG(WARN, kLog) << "baton-keeper did not let the memory go: " << released.ToString();
  }
  if (::unlink(config_.memory_record_path().c_str()) != 0 && errno != ENOENT) {
    BATON_LOG(WARN, kLog) << "removing " << config_.memory_record_path() << ": "
                          << std::strerror(errno);
  }
  return released.ok();
}

// What the engines map, as the Coordinator checks their Reattach against it.
void Controller::NoteMemoryIdentity(const std::string& weights_why, const std::string& pool_why) {
  struct stat arena {
  }, pool{};
  if (::fstat(weights_->arena().memory().fd(), &arena) == 0) {
    found_.arena_dev = arena.st_dev;
    found_.arena_ino = arena.st_ino;
  }
  if (::fstat(pool_.fd(), &pool) == 0) {
    found_.pool_dev = pool.st_dev;
    found_.pool_ino = pool.st_ino;
  }
  found_.memory_adopted =
      weights_why.empty() && pool_why.empty() && (!cuda_backend_ || device_adopted_);
  if (!weights_why.empty()) {
    found_.memory_reason = "weights loaded afresh: " + weights_why;
  } else if (!pool_why.empty()) {
    found_.memory_reason = "pool made afresh: " + pool_why;
  } else if (cuda_backend_ && !device_adopted_) {
    found_.memory_reason = "device memory made afresh: " + device_why_;
  }
}

Status Controller::LoadWeights() {
  WeightCacheOptions wopts;
  wopts.arena.numa_node = config_.numa_node;
  wopts.arena.huge_pages = config_.weights_huge_pages;
  wopts.arena.max_huge_pages = config_.weights_max_huge_pages;
  wopts.arena.lock = config_.weights_lock;
  BATON_ASSIGN_OR_RETURN(WeightCache cache, WeightCache::Load(config_.model_dir, wopts));
  weights_.emplace(std::move(cache));
  for (const std::string& w : weights_->arena().warnings()) {
    BATON_LOG(WARN, kLog) << "weight arena: " << w;
  }
  return OkStatus();
}

Status Controller::MakePool() {
  const bool huge_blocks = config_.block_bytes % kHugePageSize == 0;
  if (config_.pool_huge_pages && !huge_blocks) {
    BATON_LOG(WARN, kLog) << "pool: block_bytes " << config_.block_bytes
                          << " is not a multiple of 2 MiB; using normal pages";
  }
  SharedMemoryOptions popts{.name = "baton-pool",
                            .size = uint64_t{config_.block_count} * config_.block_bytes,
                            .try_huge_pages = config_.pool_huge_pages && huge_blocks};
  BATON_ASSIGN_OR_RETURN(pool_, SharedMemory::Create(popts));
  if (!pool_.fallback_reason().empty()) {
    BATON_LOG(WARN, kLog) << "pool: huge pages unavailable, using normal pages: "
                          << pool_.fallback_reason();
  }
  BATON_ASSIGN_OR_RETURN(pool_map_, pool_.Map(Protection::kReadWrite, /*populate=*/true));
  if (Status sealed = pool_.Seal(Sealing::kFixedSize); !sealed.ok()) {
    BATON_LOG(WARN, kLog) << "pool: not sealed against resizing (" << sealed.message()
                          << "): an engine's ftruncate could take its pages from the others";
  }
  return OkStatus();
}

// On the CUDA backend: the device copy of the weights and the device pool, adopted from
// baton-keeper (controller_device_keep.cc) or else made here, then kept. Where they cannot be
// made, "auto" goes on with the host backend and says why.
Status Controller::SetUpDeviceMemory(const BackendChoice& backend, BackendMode mode,
                                     KeeperClient* keeper, bool host_adopted) {
  if (backend.kind != MemoryBackendKind::kCuda) return OkStatus();
  device_options_ = DeviceOwnerOptions{.device = backend.device,
                                       .arena_read_only = weights_->arena().adopted(),
                                       .block_count = config_.block_count,
                                       .block_bytes = config_.block_bytes,
                                       .pool_chunk_bytes = config_.gpu_pool_chunk_bytes};
  Result<std::unique_ptr<DeviceOwner>> owner = Unavailable("not adopted");
  device_adopted_ = false;
  if (keeper == nullptr) {
    device_why_ = keeper_state_;
  } else if (!host_adopted) {
    device_why_ = "the host weights or pool were not adopted";
  } else {
    owner = AdoptDevice(*keeper);
    device_adopted_ = owner.ok();
    device_why_ = owner.ok() ? "" : owner.status().message();
  }
  if (!device_adopted_) {
    if (keeper != nullptr) {
      BATON_LOG(INFO, kLog) << "device memory: made anew (" << device_why_ << ")";
      ForgetKeptDevice(*keeper);  // before the new copy: a GPU has no room for two
    }
    owner = MakeDeviceOwner();
  }
  if (!owner.ok()) {
    const Status why = owner.status().WithContext("device memory on CUDA device " +
                                                  std::to_string(backend.device));
    if (mode == BackendMode::kCuda) return why;
    BATON_LOG(WARN, kLog) << "backend: host (" << why.message() << ")";
    return OkStatus();
  }
  device_ = std::move(owner).value();
  cuda_backend_ = true;
  BATON_LOG(INFO, kLog) << "device memory: " << device_->Describe();
  if (keeper != nullptr && !device_adopted_) KeepDevice(*keeper);
  Result<std::unique_ptr<NvmlLibrary>> nvml = NvmlLibrary::Load();
  if (nvml.ok()) {
    nvml_ = std::move(nvml).value();
    BATON_LOG(INFO, kLog) << "barrier: reap, then NVML (" << nvml_->library()
                          << ") no longer lists the holder on GPU " << device_->pci_bus_id()
                          << ", then the new holder's scrub";
  } else {
    BATON_LOG(WARN, kLog) << "barrier: NVML unavailable (" << nvml.status().message()
                          << "): the reap, then the new holder's scrub";
  }
  return OkStatus();
}

Result<std::unique_ptr<DeviceOwner>> Controller::MakeDeviceOwner() const {
  const PinnedArena& arena = weights_->arena();
  return DeviceOwner::Create(device_options_, std::span<uint8_t>(arena.data(), arena.size()));
}

bool Controller::DeviceMemoryPresent() const { return !cuda_backend_ || device_ != nullptr; }

Status Controller::ProbeDevice() {
  if (device_ == nullptr) return Unavailable("no device memory");
  return device_->Probe(kDeviceProbeTimeout);
}

// The lost device memory goes, and what baton-keeper keeps of it: a successor must not adopt
// it, and the rebuilt copy needs the room.
void Controller::DropDevice() {
  device_.reset();
  device_adopted_ = false;
  device_why_ = "the device memory was lost and is made anew from the pinned cache";
  if (std::optional<KeeperClient> keeper = RunningKeeper(); keeper.has_value()) {
    ForgetKeptDevice(*keeper);
  }
}

// Pins the arena and copies the weights on this thread; the Coordinator retries with backoff.
Status Controller::RebuildDevice() {
  BATON_ASSIGN_OR_RETURN(device_, MakeDeviceOwner());
  BATON_LOG(INFO, kLog) << "device memory rebuilt from the pinned cache: " << device_->Describe();
  if (std::optional<KeeperClient> keeper = RunningKeeper(); keeper.has_value()) {
    ForgetKeptDevice(*keeper);  // a Drop that could not reach the keeper
    KeepDevice(*keeper);
  }
  return OkStatus();
}

}  // namespace baton
