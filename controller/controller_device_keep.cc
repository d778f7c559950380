// Controller: the device memory that baton-keeper keeps on the CUDA backend (kept_memory.h).
//
// Kept: the device weights' and the device pool's chunk fds, in parts of at most
// kDeviceFdsPerPart, then the "device" manifest naming the host weights and pool the copy
// belongs to, then the record. Adopted only when every step proves out: the record names
// the manifest, the manifest names the adopted host memory and this device, every part is
// there and in order, and DeviceOwner::Adopt accepts the chunks. Anything else is refused
// with the reason, the kept device items are let go and the memory is made anew.
#include "base/log.h"
#include "controller/controller.h"
#include "controller/keeper/keeper_client.h"
#include "controller/kept_memory.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

const char* const kRegions[] = {"weights", "pool"};

// Every fd of one region's parts, in chunk order.
Result<KeptDeviceRegion> FetchRegion(KeeperClient& keeper, const std::string& region,
                                     const DeviceRegionManifest& m, uint64_t generation) {
  KeptDeviceRegion out{.chunk_bytes = m.chunk_bytes, .fds = {}};
  for (uint32_t k = 0; k < m.parts; ++k) {
    const std::string name = DevicePartName(region, k);
    BATON_ASSIGN_OR_RETURN(std::optional<KeptItem> item, keeper.Fetch(name));
    if (!item.has_value()) return FailedPrecondition("no " + name + " is kept");
    BATON_ASSIGN_OR_RETURN(DevicePartManifest part,
                           DecodeDevicePartManifest(item->manifest, "the kept " + name));
    if (part.generation != generation || part.part != k || part.first_chunk != out.fds.size() ||
        part.chunks != item->fds.size() || part.chunks == 0) {
      return FailedPrecondition("the kept " + name + " is not the part the manifest names");
    }
    for (UniqueFd& fd : item->fds) out.fds.push_back(std::move(fd));
  }
  if (out.fds.size() != m.chunks) {
    return FailedPrecondition("the kept device " + region + " parts hold " +
                              std::to_string(out.fds.size()) + " chunks, the manifest " +
                              std::to_string(m.chunks));
  }
  return out;
}

}  // namespace

std::optional<KeeperClient> Controller::RunningKeeper() {
  if (!config_.keep_memory) return std::nullopt;
  Result<KeeperClient> keeper = KeeperClient::Connect(config_.keeper_socket_path(), "", "");
  if (!keeper.ok()) {
    BATON_LOG(WARN, kLog) << "baton-keeper: " << keeper.status().message();
    return std::nullopt;
  }
  return std::move(keeper).value();
}

void Controller::SaveRecord() {
  if (Status saved = SaveMemoryRecord(config_.memory_record_path(), memory_record_); !saved.ok()) {
    BATON_LOG(WARN, kLog) << "the memory record is not saved: " << saved.ToString();
  }
}

Result<std::unique_ptr<DeviceOwner>> Controller::AdoptDevice(KeeperClient& keeper) {
  if (memory_record_.device_generation == 0) {
    return FailedPrecondition("the memory record names no kept device memory");
  }
  BATON_ASSIGN_OR_RETURN(std::optional<KeptItem> item, keeper.Fetch(kKeptDeviceName));
  if (!item.has_value()) return FailedPrecondition("no device memory is kept");
  BATON_ASSIGN_OR_RETURN(DeviceManifest kept,
                         DecodeDeviceManifest(item->manifest, "the kept device manifest"));
  if (kept.generation != memory_record_.device_generation) {
    return FailedPrecondition("the kept device memory is not the one the memory record names");
  }
  const DeviceManifest now{.weights_generation = memory_record_.weights_generation,
                           .pool_generation = memory_record_.pool_generation,
                           .device = device_options_.device,
                           .pci_bus_id = kept.pci_bus_id,  // checked against the owner below
                           .block_count = config_.block_count,
                           .block_bytes = config_.block_bytes,
                           .weights = {},
                           .pool = {}};
  if (const std::string why = DeviceMismatch(kept, now); !why.empty()) {
    return FailedPrecondition(why);
  }
  KeptDeviceMemory memory;
  BATON_ASSIGN_OR_RETURN(memory.weights,
                         FetchRegion(keeper, kRegions[0], kept.weights, kept.generation));
  BATON_ASSIGN_OR_RETURN(memory.pool, FetchRegion(keeper, kRegions[1], kept.pool, kept.generation));
  const PinnedArena& arena = weights_->arena();
  BATON_ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceOwner> owner,
      DeviceOwner::Adopt(device_options_, std::span<uint8_t>(arena.data(), arena.size()),
                         std::move(memory)));
  if (owner->pci_bus_id() != kept.pci_bus_id) {
    return FailedPrecondition("the kept device memory is on GPU " + kept.pci_bus_id + ", device " +
                              std::to_string(device_options_.device) + " is " +
                              owner->pci_bus_id());
  }
  BATON_LOG(INFO, kLog) << "device memory adopted from baton-keeper: nothing copied";
  return owner;
}

void Controller::KeepDevice(KeeperClient& keeper) {
  if (device_ == nullptr) return;
  Status kept = OkStatus();
  Result<uint64_t> generation = NewGeneration();
  Result<KeptDeviceMemory> memory = device_->ExportForKeeping();
  if (memory_record_.weights_generation == 0 || memory_record_.pool_generation == 0) {
    kept = FailedPrecondition("the host weights and pool are not kept");
  } else if (!generation.ok()) {
    kept = generation.status();
  } else if (!memory.ok()) {
    kept = memory.status();
  }
  DeviceManifest m{.generation = generation.ok() ? *generation : 0,
                   .weights_generation = memory_record_.weights_generation,
                   .pool_generation = memory_record_.pool_generation,
                   .device = device_->device(),
                   .pci_bus_id = device_->pci_bus_id(),
                   .block_count = config_.block_count,
                   .block_bytes = config_.block_bytes,
                   .weights = {},
                   .pool = {}};
  if (kept.ok()) {
    const KeptDeviceRegion* regions[] = {&memory->weights, &memory->pool};
    DeviceRegionManifest* manifests[] = {&m.weights, &m.pool};
    for (int r = 0; r < 2 && kept.ok(); ++r) {
      const std::vector<UniqueFd>& fds = regions[r]->fds;
      manifests[r]->chunk_bytes = regions[r]->chunk_bytes;
      manifests[r]->chunks = static_cast<uint32_t>(fds.size());
      manifests[r]->parts =
          static_cast<uint32_t>((fds.size() + kDeviceFdsPerPart - 1) / kDeviceFdsPerPart);
      for (uint32_t k = 0; k < manifests[r]->parts && kept.ok(); ++k) {
        const size_t first = size_t{k} * kDeviceFdsPerPart;
        const size_t count = std::min(kDeviceFdsPerPart, fds.size() - first);
        std::vector<int> raw;
        for (size_t i = first; i < first + count; ++i) raw.push_back(fds[i].get());
        const DevicePartManifest part{.generation = m.generation,
                                      .part = k,
                                      .first_chunk = static_cast<uint32_t>(first),
                                      .chunks = static_cast<uint32_t>(count)};
        kept = keeper.Keep(DevicePartName(kRegions[r], k), EncodeDevicePartManifest(part), raw);
      }
    }
  }
  if (kept.ok()) kept = keeper.Keep(kKeptDeviceName, EncodeDeviceManifest(m), {});
  if (!kept.ok()) {
    BATON_LOG(WARN, kLog) << "device memory not kept (a restarted controller makes it anew): "
                          << kept.ToString();
    ForgetKeptDevice(keeper);
    return;
  }
  memory_record_.device_generation = m.generation;
  SaveRecord();
  BATON_LOG(INFO, kLog) << "device memory kept by baton-keeper: " << m.weights.chunks
                        << " weight chunks and " << m.pool.chunks << " pool chunks in "
                        << m.weights.parts + m.pool.parts << " parts";
}

void Controller::ForgetKeptDevice(KeeperClient& keeper) {
  if (memory_record_.device_generation != 0) {
    memory_record_.device_generation = 0;
    SaveRecord();
  }
  // The manifest first: parts without it are never adopted.
  Status forgot = keeper.Forget(kKeptDeviceName).status();
  for (const char* region : kRegions) {
    for (uint32_t k = 0; forgot.ok(); ++k) {
      Result<bool> found = keeper.Forget(DevicePartName(region, k));
      forgot = found.status();
      if (found.ok() && !*found) break;
    }
  }
  if (!forgot.ok()) {
    BATON_LOG(WARN, kLog) << "baton-keeper did not let the kept device memory go: "
                          << forgot.ToString();
  }
}

}  // namespace baton
