#include "perf/gpu/gpu_check_steps.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <sys/stat.h>

#include <algorithm>
#include <thread>

#include "base/log.h"
#include "cuda/drill/device_drill.h"
#include "cuda/kernels/kernels_ptx.h"
#include "cuda/memory/pinned_host.h"
#include "cuda/memory/rematerializer.h"
#include "cuda/memory/vmm.h"
#include "proto/transport/shared_memory.h"

namespace baton {
namespace {

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint32_t kRematSeed = 0xC0FFEEu;

using json = nlohmann::json;

double Round(double v) { return std::round(v * 1000) / 1000; }

json Error(const Status& s) { return json{{"ok", false}, {"error", s.ToString()}}; }

// Fills words [0, bytes/4) of `data` with FillPatternWord(i, seed), on every core.
void FillHost(uint8_t* data, uint64_t bytes, uint32_t seed) {
  auto* words = reinterpret_cast<uint32_t*>(data);
  const uint64_t n = bytes / 4;
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      for (uint64_t i = n * t / threads; i < n * (t + 1) / threads; ++i) {
        words[i] = FillPatternWord(i, seed);
      }
    });
  }
  for (std::thread& t : pool) t.join();
}

Status VerifySamples(const PrimaryContext& ctx, CUdeviceptr dst, uint64_t bytes, uint32_t seed) {
  for (uint64_t k = 0; k < 256; ++k) {
    const uint64_t i = (bytes / 4 - 1) * k / 255;
    uint32_t w = 0;
    BATON_RETURN_IF_ERROR(BATON_CU(ctx.driver(), cuMemcpyDtoH, &w, dst + i * 4, 4));
    if (w != FillPatternWord(i, seed)) {
      return DataLoss("device word " + std::to_string(i) + " is " + std::to_string(w) +
                      " after the copy, expected " + std::to_string(FillPatternWord(i, seed)));
    }
  }
  return OkStatus();
}

// Best of `reps` for three copies into `dst`, interleaved so that drift hits all alike: the
// baseline (one cuMemcpyHtoD from classic cuMemAllocHost memory), cuMemcpyHtoD from the cache
// one registration at a time (is the cache really DMA-able?), and the rematerializer's
// chunked multi-stream copy.
Result<json> CompareCopies(const PrimaryContext& ctx, const PinnedHostCache& cache,
                           const PinnedHostBuffer& baseline, CUdeviceptr dst,
                           const GpuCheckOptions& o) {
  const uint64_t bytes = cache.bytes();
  BATON_ASSIGN_OR_RETURN(Rematerializer remat,
                         Rematerializer::Create(ctx, {.streams = o.remat_streams,
                                                      .chunk_bytes = o.remat_chunk_mib * kMiB}));
  json base_runs = json::array();
  json plain_runs = json::array();
  json remat_runs = json::array();
  double base_best = 0;
  double plain_best = 0;
  double remat_best = 0;
  for (int r = 0; r < o.reps; ++r) {
    BATON_ASSIGN_OR_RETURN(CopyStats b, PlainPinnedCopy(ctx, dst, baseline.data(), bytes));
    BATON_ASSIGN_OR_RETURN(CopyStats p,
                           PlainPinnedCopy(ctx, dst, cache.data(), bytes, cache.copy_unit()));
    BATON_ASSIGN_OR_RETURN(CopyStats m, remat.Copy(dst, cache.data(), bytes, cache.copy_unit()));
    base_runs.push_back(Round(b.gbps));
    plain_runs.push_back(Round(p.gbps));
    remat_runs.push_back(Round(m.gbps));
    base_best = std::max(base_best, b.gbps);
    plain_best = std::max(plain_best, p.gbps);
    remat_best = std::max(remat_best, m.gbps);
  }
  BATON_RETURN_IF_ERROR(VerifySamples(ctx, dst, bytes, kRematSeed));
  return json{{"ok", true},
              {"cache", ToString(cache.kind())},
              {"cache_note", cache.note()},
              {"cache_setup_ms", Round(cache.setup_ms())},
              {"bytes", bytes},
              {"streams", o.remat_streams},
              {"chunk_bytes", o.remat_chunk_mib * kMiB},
              {"copy_unit_bytes", cache.copy_unit()},  // the longest copy in one registration
              {"chunks_within_registrations", cache.copy_unit() % (o.remat_chunk_mib * kMiB) == 0},
              {"baseline_gbps", Round(base_best)},
              {"cache_single_copy_gbps", Round(plain_best)},
              {"remat_gbps", Round(remat_best)},
              {"ratio", base_best > 0 ? Round(remat_best / base_best) : 0.0},
              {"baseline_runs_gbps", base_runs},
              {"cache_single_copy_runs_gbps", plain_runs},
              {"remat_runs_gbps", remat_runs},
              {"verified", true}};
}

// The preferred cache: host-NUMA VMM memory, filled from `baseline`, against it.
json HostNumaRemat(const PrimaryContext& ctx, const GpuCheckOptions& o,
                   const PinnedHostBuffer& baseline, CUdeviceptr device) {
  const uint64_t bytes = o.remat_gib * kGiB;
  Result<PinnedHostCache> numa = PinnedHostCache::CreateHostNuma(
      ctx, {.bytes = bytes, .chunk_bytes = o.weight_chunk_mib * kMiB});
  if (!numa.ok()) return json{{"ok", false}, {"skipped", numa.status().message()}};
  // Filled by a copy, not by the CPU: a driver that maps the chunks for the GPU only fails
  // this copy with an error where CPU stores would kill the whole run.
  Status filled = PlainPinnedCopy(ctx, reinterpret_cast<CUdeviceptr>(numa->data()), baseline.data(),
                                  bytes, numa->copy_unit())
                      .status()
                      .WithContext("filling the host-NUMA cache");
  if (!filled.ok()) return Error(filled);
  Result<json> r = CompareCopies(ctx, *numa, baseline, device, o);
  return r.ok() ? *r : Error(r.status());
}

// The fallback: a memfd arena, as weightcache/io/pinned_arena.h makes it (huge pages where
// they can be reserved, filled, then sealed read-only as the weight cache does), registered
// in chunks. A failure here is this cache's result, not the step's end.
json RegisteredRemat(const PrimaryContext& ctx, const GpuCheckOptions& o,
                     const PinnedHostBuffer& baseline, CUdeviceptr device) {
  const uint64_t bytes = o.remat_gib * kGiB;
  Result<SharedMemory> shm =
      SharedMemory::Create({.name = "gpu-check-arena", .size = bytes, .try_huge_pages = true});
  if (!shm.ok()) return Error(shm.status());
  Result<Mapping> map = shm->Map(Protection::kReadWrite, /*populate=*/true);
  if (!map.ok()) return Error(map.status());
  FillHost(map->data(), bytes, kRematSeed);
  const Status sealed = shm->Seal(Sealing::kReadOnly);
  Result<PinnedHostCache> reg =
      PinnedHostCache::Register(ctx, map->data(), bytes, o.weight_chunk_mib * kMiB);
  Result<json> r =
      reg.ok() ? CompareCopies(ctx, *reg, baseline, device, o) : Result<json>(reg.status());
  json out = r.ok() ? *r : Error(r.status());
  out["huge_pages"] = shm->huge_pages();
  if (!shm->huge_pages()) out["huge_pages_note"] = shm->fallback_reason();
  out["sealed"] = sealed.ok() ? json(true) : json(sealed.message());
  return out;
}

}  // namespace

json DeviceInfo(const PrimaryContext& ctx) {
  const CudaDriver& cu = ctx.driver();
  char name[256] = {};
  size_t total = 0;
  size_t free_bytes = 0;
  int numa_id = -1;
  int mode = -1;
  char bus[32] = {};
  (void)BATON_CU(cu, cuDeviceGetName, name, sizeof(name) - 1, ctx.device());
  (void)BATON_CU(cu, cuDeviceTotalMem, &total, ctx.device());
  (void)BATON_CU(cu, cuMemGetInfo, &free_bytes, &total);
  (void)BATON_CU(cu, cuDeviceGetAttribute, &mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, ctx.device());
  (void)BATON_CU(cu, cuDeviceGetPCIBusId, bus, sizeof(bus) - 1, ctx.device());
  const HostNumaSupport numa = QueryHostNuma(ctx);
  numa_id = numa.numa_node;
  Result<size_t> g = VmmGranularity(ctx, VmmLocation::kDevice, 0);
  return json{{"name", name},
              {"ordinal", ctx.ordinal()},
              {"pci_bus_id", bus},
              {"total_bytes", total},
              {"free_bytes", free_bytes},
              {"driver", cu.version_string()},
              {"compute_mode", mode},
              {"granularity_bytes", g.ok() ? *g : 0},
              {"host_numa_vmm", numa.supported},
              {"host_numa_node", numa.supported ? numa_id : -1},
              {"host_numa_note", numa.reason}};
}

json RematStep(const PrimaryContext& ctx, const GpuCheckOptions& o) {
  const uint64_t bytes = o.remat_gib * kGiB;
  const uint64_t chunk = o.weight_chunk_mib * kMiB;
  Result<VmmRegion> dev =
      VmmRegion::Create(ctx, {.name = "remat", .bytes = bytes, .chunk_bytes = chunk});
  if (!dev.ok()) return Error(dev.status());
  Result<VmmView> view =
      VmmView::Reserve(ctx, dev->chunk_bytes(), dev->chunk_count(), dev->granularity());
  if (!view.ok()) return Error(view.status());
  if (Status s = view->Borrow(*dev); !s.ok()) return Error(s);
  if (Status s = view->MapAll({}).status(); !s.ok()) return Error(s);
  // The baseline's source: classic pinned memory, the same bytes as the cache.
  Result<PinnedHostBuffer> baseline = PinnedHostBuffer::Allocate(ctx.driver(), bytes);
  if (!baseline.ok()) return Error(baseline.status().WithContext("baseline buffer"));
  FillHost(baseline->data(), bytes, kRematSeed);

  json out{{"ok", true}};
  out["host_numa"] = HostNumaRemat(ctx, o, *baseline, view->base());
  out["registered"] = RegisteredRemat(ctx, o, *baseline, view->base());
  // The headline: the host-NUMA cache where there is one, else the registered arena.
  const json main = out["host_numa"].value("ok", false) ? out["host_numa"] : out["registered"];
  out["ok"] = main.value("ok", false);
  out["cache"] = main.value("cache", "none");
  out["remat_gbps"] = main.value("remat_gbps", 0.0);
  out["baseline_gbps"] = main.value("baseline_gbps", 0.0);
  out["ratio"] = main.value("ratio", 0.0);
  return out;
}

json DrillStep(const PrimaryContext& ctx, const GpuCheckOptions& o, uint64_t weight_gib) {
  size_t free_bytes = 0;
  size_t total = 0;
  if (Status s = BATON_CU(ctx.driver(), cuMemGetInfo, &free_bytes, &total); !s.ok()) {
    return Error(s);
  }
  const uint64_t weights = weight_gib * kGiB;
  uint64_t pool = o.pool_gib * kGiB;
  const uint64_t margin = 6 * kGiB;  // the two peers' contexts and the kernels
  json out{{"weights_bytes", weights}, {"weights_gib", weight_gib}};
  if (weights + pool + margin > free_bytes) {
    if (weights + 4 * kGiB + margin > free_bytes) {
      return json{{"ok", false},
                  {"weights_gib", weight_gib},
                  {"error", "not enough device memory: " + std::to_string(free_bytes) + " free"}};
    }
    pool = (free_bytes - weights - margin) / kGiB * kGiB;
    out["pool_note"] = "pool shrunk to fit the device";
  }
  Result<VmmRegion> w = VmmRegion::Create(
      ctx, {.name = "weights", .bytes = weights, .chunk_bytes = o.weight_chunk_mib * kMiB});
  if (!w.ok()) return Error(w.status());
  if (Status s = FillDrillWeights(ctx, *w); !s.ok()) return Error(s);
  json runs = json::array();
  double worst = 0;
  bool all_ok = true;
  for (int r = 0; r < o.drill_runs; ++r) {
    const std::string dir =
        o.out_dir + "/drill-" + std::to_string(weight_gib) + "g-" + std::to_string(r);
    ::mkdir(dir.c_str(), 0700);
    DrillConfig config{.device = ctx.ordinal(),
                       .pool_bytes = pool,
                       .pool_chunk_bytes = o.pool_chunk_mib * kMiB,
                       .peer_command = o.peer_command,
                       .work_dir = dir};
    Result<DrillResult> d = RunPromotionDrill(ctx, *w, config);
    if (!d.ok()) {
      runs.push_back(Error(d.status()));
      all_ok = false;
      break;
    }
    json phases = json::object();
    for (const auto& [k, v] : d->standby) phases[k] = Round(v);
    const bool checks = d->writes_crossed && d->stale_writes_stopped && d->headers_scrubbed &&
                        d->no_foreign_byte && d->kv_copy_ok && d->reused_after_barrier;
    all_ok = all_ok && checks;
    worst = std::max(worst, d->promotion_ms);
    runs.push_back(json{{"promotion_ms", Round(d->promotion_ms)},
                        {"kill_reap_ms", Round(d->kill_reap_ms)},
                        {"teardown_ms", Round(d->kill_reap_ms)},
                        {"promoted_before_exit", d->promoted_before_exit},
                        {"writes_after_promotion", d->writes_after_promotion},
                        {"no_foreign_byte", d->no_foreign_byte},
                        {"kv_copy_ok", d->kv_copy_ok},
                        {"reused_after_barrier", d->reused_after_barrier},
                        {"reserve_blocks", d->reserve_blocks},
                        {"promote_rtt_ms", Round(d->promote_rtt_ms)},
                        {"standby_ready_ms", Round(d->standby_ready_ms)},
                        {"standby", phases},
                        {"pool_bytes", d->pool_bytes},
                        {"pool_chunks", d->pool_chunks},
                        {"counter_at_kill", d->counter_at_kill},
                        {"writes_crossed", d->writes_crossed},
                        {"stale_writes_stopped", d->stale_writes_stopped},
                        {"headers_scrubbed", d->headers_scrubbed}});
  }
  out["ok"] = all_ok;
  out["promotion_ms_max"] = Round(worst);
  out["runs"] = runs;
  return out;
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
