// The promotion drill on a GPU: real processes, real device memory, a primary killed in the
// middle of a kernel, and the standby promoted onto the pool it had only reserved. Run by
// tests/cuda (small sizes) and perf/gpu_check (16 GB and 64 GB weight sets).
//
// The owner (this process, standing in for the controller) holds the weights region (filled
// with FillPatternWord(i, kDrillWeightSeed)) and the pool region, and starts two peers with
// `peer_command ROLE SOCKET REPORT DEVICE HEADER_BYTES` (ROLE primary|standby). Each peer
// (RunDrillPeer) connects, accepts the weights (mapped READ) and the pool (reserved only), checks
// weight samples, and says StandbyReady. Then:
//   1. Promote(epoch 1) to the primary: it maps the pool READWRITE, starts baton_spin on
//      block 0 (writing block 0's header and a counter, forever) and acks once the counter
//      moves. The owner reads the counter through its own mapping: writes cross processes.
//   2. SIGKILL the primary in the middle of that kernel and reap it (the barrier's first half).
//   3. Promote(epoch 2) to the standby: it maps the pool (one cuMemMap per chunk), grants
//      READWRITE once, scrubs every block header on its stream, synchronizes and acks. Then it
//      checks that block 0's header is zero, that the counter no longer moves and that the
//      weights are intact, writes its phase times to REPORT (key=value lines) and says so
//      with a Heartbeat; the owner checks the same through its own mapping.
// Promotion time is SIGKILL to PromoteAck, with the per-phase breakdown. Every wait has a
// deadline; every child is killed and reaped on any exit path. Blocking; one thread.
#pragma once

#ifdef BATON_HAVE_CUDA_HEADERS

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "cuda/driver/cuda_handles.h"
#include "cuda/memory/vmm.h"

namespace baton {

inline constexpr uint32_t kDrillWeightSeed = 0x5EEDBA70u;
// The spin kernel's counter lives this far into block 0, past any header.
inline constexpr uint64_t kDrillCounterOffset = 4096;

struct DrillConfig {
  int device = 0;
  uint64_t pool_bytes = 1ull << 30;
  uint64_t pool_chunk_bytes = 256ull << 20;
  uint64_t block_bytes = 2ull << 20;
  uint32_t header_bytes = 64;
  std::vector<std::string> peer_command;  // ROLE SOCKET REPORT DEVICE HEADER_BYTES appended
  std::string work_dir;                   // socket and reports; must exist
  Duration step_timeout = std::chrono::seconds(60);
};

struct DrillResult {
  uint64_t weight_bytes = 0;
  uint64_t pool_bytes = 0;
  size_t pool_chunks = 0;
  double standby_ready_ms = 0;   // standby start to StandbyReady (context, import, map RO)
  double kill_reap_ms = 0;       // SIGKILL to reaped
  double promote_rtt_ms = 0;     // Promote sent to PromoteAck
  double promotion_ms = 0;       // SIGKILL to PromoteAck
  uint64_t counter_at_kill = 0;  // spins the primary's kernel had done
  bool writes_crossed = false;   // the owner saw the primary's kernel writes
  bool stale_writes_stopped = false;
  bool headers_scrubbed = false;
  std::map<std::string, double> standby = {};  // the standby's report: map_ms, access_ms, ...
};

// Owner side. `weights` must be mapped readable by no one else yet and filled with the
// weight pattern (FillDrillWeights).
Result<DrillResult> RunPromotionDrill(const PrimaryContext& ctx, const VmmRegion& weights,
                                      const DrillConfig& config);

// Fills every chunk of `weights` with FillPatternWord(i, kDrillWeightSeed), through a
// temporary read-write mapping in this process.
Status FillDrillWeights(const PrimaryContext& ctx, const VmmRegion& weights);

// Peer side: the arguments appended to peer_command, {ROLE, SOCKET, REPORT, DEVICE,
// HEADER_BYTES}. Returns the exit code: 0 success, 1 failure (the reason on stderr and, when
// connected, to the owner in an ErrorMsg), 2 bad arguments.
int RunDrillPeer(const std::vector<std::string>& args);

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
