// libbaton_torch_alloc.so: standby/sdk/baton_torch_alloc.h over libbaton_engine.so's C ABI.
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "standby/sdk/baton_torch_alloc.h"
#include "standby/sdk/block_allocator.h"

namespace {

struct Attached {
  baton_engine* engine = nullptr;
  int device = -1;
  std::unique_ptr<baton::BlockAllocator> blocks;
};

baton::Mutex g_mu;
Attached g_attached BATON_GUARDED_BY(g_mu);
thread_local std::string g_error;

int Fail(const baton::Status& s) {
  g_error = s.message();
  return static_cast<int>(s.code());
}

// The engine's held extents, as the allocator takes them.
baton::Status RefreshLocked() BATON_REQUIRES(g_mu) {
  if (g_attached.engine == nullptr) return baton::FailedPrecondition("not attached");
  std::vector<baton_extent> extents(baton_engine_extents(g_attached.engine, nullptr, 0) + 16);
  const size_t n = baton_engine_extents(g_attached.engine, extents.data(), extents.size());
  std::vector<baton::HeldExtent> held;
  for (size_t i = 0; i < n && i < extents.size(); ++i) {
    held.push_back({extents[i].first, extents[i].count});
  }
  return g_attached.blocks->Reset(held);
}

}  // namespace

int baton_torch_alloc_attach(baton_engine* engine) {
  if (engine == nullptr) return Fail(baton::InvalidArgument("engine is NULL"));
  baton_device_region pool;
  if (int rc = baton_engine_device_pool(engine, &pool); rc != 0) {
    return Fail(baton::Status(static_cast<baton::StatusCode>(rc), baton_engine_last_error()));
  }
  baton_pool_info info;
  if (int rc = baton_engine_pool(engine, &info); rc != 0) {
    return Fail(baton::Status(static_cast<baton::StatusCode>(rc), baton_engine_last_error()));
  }
  baton::MutexLock lock(g_mu);
  g_attached.engine = engine;
  g_attached.device = pool.device;
  g_attached.blocks =
      std::make_unique<baton::BlockAllocator>(pool.address, info.block_bytes, info.block_count);
  baton::Status s = RefreshLocked();
  return s.ok() ? 0 : Fail(s);
}

int baton_torch_alloc_refresh(void) {
  baton::MutexLock lock(g_mu);
  baton::Status s = RefreshLocked();
  return s.ok() ? 0 : Fail(s);
}

void* baton_torch_malloc(ssize_t size, int device, void*) {
  baton::MutexLock lock(g_mu);
  if (g_attached.blocks == nullptr || device != g_attached.device || size <= 0) {
    g_error = "baton_torch_malloc: not attached, another device, or a size <= 0";
    return nullptr;
  }
  baton::Result<uint64_t> address = g_attached.blocks->Allocate(static_cast<uint64_t>(size));
  if (!address.ok()) {
    g_error = address.status().message();
    return nullptr;
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(*address));
}

void baton_torch_free(void* ptr, ssize_t, int, void*) {
  if (ptr == nullptr) return;
  baton::MutexLock lock(g_mu);
  if (g_attached.blocks == nullptr) return;
  baton::Status s = g_attached.blocks->Free(reinterpret_cast<uintptr_t>(ptr));
  if (!s.ok()) g_error = s.message();
}

uint64_t baton_torch_alloc_free_bytes(void) {
  baton::MutexLock lock(g_mu);
  return g_attached.blocks == nullptr ? 0 : g_attached.blocks->free_bytes();
}

const char* baton_torch_alloc_last_error(void) { return g_error.c_str(); }
