// The measurements of perf/gpu_check on a GPU host, each a JSON object that carries its own
// "error" when it fails (one failed step does not hide the others):
//   DeviceInfo   name, memory, driver, VMM/POSIX-fd/host-NUMA support, granularity
//   RematStep    rebuilding a device copy from the pinned host cache with chunked copies on
//                several streams, against one plain pinned cuMemcpyHtoD in the same run, for
//                the host-NUMA cache and for a registered memfd arena
//   DrillStep    the promotion drill of cuda/drill/device_drill.h with a weight set of N GiB
// Blocking; one thread (the context current on it).
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda/driver/cuda_handles.h"

namespace baton {

struct GpuCheckOptions {
  int device = 0;
  std::string out_dir;
  std::vector<uint64_t> weight_gib = {16, 64};
  uint64_t weight_chunk_mib = 1024;
  uint64_t pool_gib = 32;
  uint64_t pool_chunk_mib = 256;
  uint64_t remat_gib = 16;
  int remat_streams = 4;
  uint64_t remat_chunk_mib = 64;
  int reps = 3;        // copies per contender
  int drill_runs = 2;  // promotion drills per weight set
  std::vector<std::string> peer_command;
};

nlohmann::json DeviceInfo(const PrimaryContext& ctx);
nlohmann::json RematStep(const PrimaryContext& ctx, const GpuCheckOptions& options);
nlohmann::json DrillStep(const PrimaryContext& ctx, const GpuCheckOptions& options,
                         uint64_t weight_gib);

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
