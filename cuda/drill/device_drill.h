// The promotion drill on a GPU: real processes, real device memory, a primary killed in the
// middle of a kernel, and the standby promoted at once, before the dead context is torn down,
// on chunks the primary never held. Run by tests/cuda (small sizes, also on the emulated
// device) and perf/gpu_check (16 GB and 64 GB weight sets).
//
// The owner (this process, standing in for the controller) holds the weights region (filled
// with FillPatternWord(i, kDrillWeightSeed)) and the pool region, whose last chunk is the
// promotion reserve, and starts two peers with `peer_command ROLE SOCKET REPORT DEVICE
// HEADER_BYTES BLOCK_BYTES` (ROLE a proto::LaunchRole's name: primary|standby). Each peer
// (RunDrillPeer) connects (Hello role drill), accepts the weights (mapped READ) and the pool
// (reserved only), checks weight samples, and says StandbyReady.
// Then:
//   1. Promote(epoch 1, every block but the reserve's) to the primary: it maps those chunks,
//      fills block 1 with a committed pattern (kDrillKvSeed: KV the standby will copy), starts
//      baton_spin on block 0 (writing block 0's header and a counter, forever) and acks once
//      the counter moves. The owner reads the counter through its own mapping.
//   2. SIGKILL the primary in the middle of that kernel, and at once, without reaping it,
//      Quarantined(the primary's blocks) and Promote(epoch 2, the reserve's blocks) to the
//      standby: it maps the reserve chunk, scrubs its headers, maps the quarantined chunks
//      READ, copies block 1 device to device into its last block, unmaps them, and acks. Then,
//      while the dead kernel may still be writing (a GPU tears the context down for tens of
//      milliseconds; the emulated device's spin thread dies with the process), it fills its
//      other blocks with its own pattern (kDrillStandbySeed) and reads its chunk back: no word
//      but its own pattern and the checked copy (no foreign byte).
//   3. The owner reaps the primary (the barrier), then Grant(epoch 2, the primary's blocks):
//      the standby maps them, scrubs their headers and checks that block 0's header is zero,
//      that the counter no longer moves, that its own chunk is still clean and the weights
//      intact, writes its phase times to REPORT (key=value lines) and says so with a
//      Heartbeat; the owner checks the same through its own mapping.
// Promotion time is SIGKILL to PromoteAck, teardown SIGKILL to reaped. Every wait has a
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
// Block 1's committed pattern (the primary's) and the standby's own blocks' pattern.
inline constexpr uint32_t kDrillKvSeed = 0x6B76C0DEu;
inline constexpr uint32_t kDrillStandbySeed = 0x57A4DB1Eu;
// The spin kernel's counter lives this far into block 0, past any header.
inline constexpr uint64_t kDrillCounterOffset = 4096;

struct DrillConfig {
  int device = 0;
  uint64_t pool_bytes = 1ull << 30;
  uint64_t pool_chunk_bytes = 256ull << 20;
  uint64_t block_bytes = 2ull << 20;
  uint32_t header_bytes = 64;
  std::vector<std::string> peer_command;  // ROLE SOCKET REPORT DEVICE HEADER BLOCK appended
  std::string work_dir;                   // socket and reports; must exist
  Duration step_timeout = std::chrono::seconds(60);
};

struct DrillResult {
  uint64_t weight_bytes = 0;
  uint64_t pool_bytes = 0;
  size_t pool_chunks = 0;
  uint32_t reserve_blocks = 0;          // the standby's chunk, the primary never held
  double standby_ready_ms = 0;          // standby start to StandbyReady (context, import, map RO)
  double kill_reap_ms = 0;              // SIGKILL to reaped (the teardown)
  double promote_rtt_ms = 0;            // Promote sent to PromoteAck
  double promotion_ms = 0;              // SIGKILL to PromoteAck
  uint64_t counter_at_kill = 0;         // spins the primary's kernel had done
  bool writes_crossed = false;          // the owner saw the primary's kernel writes
  bool promoted_before_exit = false;    // PromoteAck came while the primary was still dying
  bool writes_after_promotion = false;  // the dead kernel still wrote after the PromoteAck
  bool no_foreign_byte = false;         // the standby's blocks held only what it wrote
  bool kv_copy_ok = false;              // block 1 copied device to device, checked
  bool reused_after_barrier = false;    // the primary's blocks granted only after its reap
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
// HEADER_BYTES, BLOCK_BYTES}. Returns the exit code: 0 success, 1 failure (the reason on stderr
// and, when connected, to the owner in an ErrorMsg), 2 bad arguments.
int RunDrillPeer(const std::vector<std::string>& args);

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
