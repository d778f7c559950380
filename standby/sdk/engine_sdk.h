// EngineSession: the engine side of Baton. An engine (the reference engine, or vLLM/SGLang
// through the C ABI in baton_engine.h) uses it to borrow memory from the controller.
//
// Life of a session:
//   1. Connect(): connects to the controller's socket, says Hello with the launch token it
//      was started with, sends Register, receives the weight arena and the pool (fds in the
//      RegisterAck), maps the arena READ-ONLY and pre-faults it (one read per page), reserves
//      the pool's address range with PROT_NONE, starts the heartbeat thread and sends
//      StandbyReady (with ready_when_waiting, the first WaitForPromotion() sends it instead).
//      The engine is now a half-started standby: nothing is mapped writable.
//   2. WaitForPromotion(): blocks until the controller promotes this engine. The granted
//      extents are then mapped writable into the reserved range (block b at
//      pool().base + b x block_bytes) and their block headers scrubbed. A promotion that does
//      not wait for the old primary's barrier (protocol 7) also reads the headers of the old
//      primary's quarantined blocks (MapQuarantined maps them read-only for a copy of the KV
//      they hold); they come writable in a Grant once the barrier has passed.
//   3. MarkServing(): the engine accepts traffic; the controller publishes its route.
//   4. While serving: NextEvent() delivers later grants, reclaim requests (answer with
//      ReturnBlocks), drain requests (answer with ReportDrained), resumes (a drain called
//      off: serve again) and stop requests; RequestBlocks() asks for more;
//      ReportError() reports an asynchronous device error (the controller fences at once);
//      CheckEpoch() says whether this engine still holds a current epoch.
//   5. The controller goes away (it crashed, or is being replaced by a newer version) at any
//      time after Connect() returned: kControllerLost. The engine keeps what it has: a primary
//      keeps serving and its blocks (CheckEpoch() stays OK), a standby stays half-started.
//      The heartbeat thread reconnects to the same socket path with a doubling backoff
//      (reconnect_backoff_initial .. reconnect_backoff_max), says Hello with the same launch
//      token and sends Reattach (protocol 5) with what it holds: its role (standby, promoted,
//      serving, draining, drained), its epoch, the extents it maps writable and the identity
//      (st_dev, st_ino) of the arena and pool memfds it maps. A ReattachAck: kControllerBack,
//      and the session goes on as in 4. A HelloReject, a Stop, or a controller too old to
//      take a Reattach: kStop. No controller within controller_absent_timeout and
//      on_controller_absent is kStop: kDisconnected (the session gave up; CheckEpoch fails).
//      Only a session that speaks protocol 5 (handles_resume) reattaches; without it a lost
//      connection is kDisconnected at once, as is one lost after a Stop.
//   6. Shutdown() (or the destructor): stops the heartbeat thread, unmaps every extent and
//      closes the connection.
//
// While the controller is away: RequestBlocks() and ReportError() return Unavailable (an
// error reported then is sent again to the controller the session reattaches to, and
// CheckEpoch() fails at once); ReturnBlocks() unmaps and returns OK (the blocks are not
// reported: the Reattach lists only what is mapped); MarkServing() and ReportDrained() return
// OK and change the role the Reattach reports; no heartbeats are sent.
//
// Threads: the session runs its own thread ("heartbeat thread") that sends heartbeats every
// interval, answers health requests, maps/unmaps extents as messages arrive and reconnects
// after the controller went away; it never waits for the engine's compute thread, so a slow
// engine under load is never declared hung. Every public method is thread-safe. Events are
// queued for the engine and taken with NextEvent()/WaitForPromotion() from any one thread.
//
// Ownership: the session owns the socket, the arena mapping, the reserved range and every
// extent mapping. Weight pointers stay valid until the session is destroyed; block memory
// until its extent is returned or Shutdown() unmaps it (stop every thread that writes to
// blocks first). Not movable (the thread refers to it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"
#include "cuda/device_session.h"
#include "weightcache/safetensors/dtype.h"

namespace baton {

class NcclWatcher;

// What the controller hands to each engine it launches, as command-line placeholders
// ({socket} {token} {role} {engine_id} {port}) and in the environment (names below).
struct EngineLaunchInfo {
  std::string socket_path;   // BATON_SOCKET
  std::string launch_token;  // BATON_LAUNCH_TOKEN
  uint64_t engine_id = 0;    // BATON_ENGINE_ID
  std::string role;          // BATON_ROLE: "primary" or "standby" (what it was launched for)
  int http_port = 0;         // BATON_HTTP_PORT (0: none assigned)
};

// Reads the BATON_* variables above; names the first one missing or malformed.
Result<EngineLaunchInfo> LaunchInfoFromEnv();

// Fills those of socket_path, launch_token and engine_id that are empty (0) from BATON_SOCKET,
// BATON_LAUNCH_TOKEN and BATON_ENGINE_ID, one field at a time; names the variable missing or
// malformed. The fields already set are kept and their variables not read.
Status FillLaunchInfoFromEnv(EngineLaunchInfo* info);

// What the session does when no controller has come back for controller_absent_timeout.
enum class ControllerAbsentAction {
  kServe,  // keep serving (a primary keeps its blocks) and keep reconnecting
  kStop,   // give up: kDisconnected, CheckEpoch() fails, and the engine should exit
};
// "serve", "stop".
const char* ToString(ControllerAbsentAction action);

struct EngineSessionOptions {
  EngineLaunchInfo launch;
  std::string engine_version = "unknown";  // shown by `batonctl status`
  std::string http_address;                // published in the route table; may be empty
  std::string peer_name;                   // names the connection in logs; "engine-<id>"
  bool prefault_weights = true;            // touch every arena page before StandbyReady
  // On a CUDA-backend controller: take the device copy of the weights and the device pool
  // (an engine that computes on the GPU), or decline them and use the host arena and pool.
  bool use_device_memory = false;
  // The engine handles kResume (serves again after a drain is called off). Without it the
  // session speaks protocol 2, and the controller retires it once drained instead; such a
  // session cannot reattach either (Reattach is protocol 5): a lost controller ends it.
  bool handles_resume = false;
  // StandbyReady goes at the first WaitForPromotion(), not at the end of Connect(): an engine
  // that builds its model on the mapped weights after connecting (a PyTorch engine) is
  // counted a ready standby only once a promotion would find it waiting. Until then the
  // controller sees it registering (heartbeats keep hang detection on it; the controller's
  // engine.register_timeout_ms bounds the time to its StandbyReady). A controller lost before
  // then ends the session, as during Connect(): it never counted the engine a standby, and
  // the next controller launches another.
  bool ready_when_waiting = false;
  Duration connect_timeout = std::chrono::seconds(10);
  // After the controller went away: the wait before the second reconnect attempt (the first
  // is made at once), doubled after each failed one up to the maximum. A failed attempt is
  // one connect(2) to a socket nobody listens on: a 10 ms cap costs nothing, and a restarted
  // controller finds its engines within 10 ms of listening.
  Duration reconnect_backoff_initial = std::chrono::milliseconds(2);
  Duration reconnect_backoff_max = std::chrono::milliseconds(10);
  // How long the controller may stay away before on_controller_absent decides (measured on
  // `clock` from the moment the connection broke); zero: never decide (keep serving).
  Duration controller_absent_timeout = Duration::zero();
  ControllerAbsentAction on_controller_absent = ControllerAbsentAction::kServe;
  Clock* clock = nullptr;  // RealClock when null
};

// Sets options->controller_absent_timeout from BATON_CONTROLLER_ABSENT_TIMEOUT_MS (an
// unsigned count of milliseconds; 0: never decide) and options->on_controller_absent from
// BATON_ON_CONTROLLER_ABSENT ("serve" or "stop"), as the controller or the operator set them
// for the engine. A variable that is unset or empty leaves its field as it is; a malformed
// one is InvalidArgument naming it, and changes nothing.
Status ControllerAbsenceFromEnv(EngineSessionOptions* options);

// One tensor of the model, in the read-only arena mapping.
struct MappedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t size = 0;  // bytes
};

struct MappedWeights {
  std::string model;
  const uint8_t* base = nullptr;  // the arena, mapped PROT_READ
  uint64_t size = 0;
  bool huge_pages = false;
  double prefault_ms = 0;
  std::vector<MappedTensor> tensors;  // in the controller's order (sorted by name)
  // nullptr when absent.
  const MappedTensor* Find(std::string_view name) const;
};

// The pool as this engine sees it: the reserved range and the block geometry.
struct PoolView {
  uint32_t block_count = 0;
  uint64_t block_bytes = 0;
  bool huge_pages = false;
  uint8_t* base = nullptr;  // reserved range; block b lives at base + b x block_bytes
  uint64_t reserved_bytes = 0;
  uint8_t* BlockData(uint32_t block) const { return base + uint64_t{block} * block_bytes; }
};

// Extents of blocks mapped writable into this engine's range.
struct MappedExtent {
  uint32_t first = 0;
  uint32_t count = 0;
  uint8_t* data = nullptr;  // pool().BlockData(first)
  uint64_t bytes = 0;       // count x block_bytes
  bool operator==(const MappedExtent& o) const { return first == o.first && count == o.count; }
};

// Bytes at the start of each block that the SDK zeroes when an extent is first mapped for a
// new holder (the block header scrub). Engines that keep per-block metadata put it here.
inline constexpr uint64_t kBlockHeaderBytes = 64;

enum class SessionEventKind {
  kPromoted,        // epoch + extents: this engine is now the primary (extents mapped)
  kGranted,         // epoch + extents: more extents mapped
  kReclaim,         // blocks: return up to that many blocks with ReturnBlocks() (whole chunks
                    // on a device pool: see reclaim_chunk_blocks())
  kDrain,           // timeout: stop admitting, finish in-flight work, then call ReportDrained()
  kResume,          // the drain is called off (the switch-over failed): admit requests again
  kStop,            // reason: the controller wants this engine to exit (also: it refused
                    // this engine's Hello or Reattach after a reconnect); epoch: the one this
                    // engine held (0 for a standby)
  kDisconnected,    // reason: the session ended without a controller (it gave up waiting for
                    // one, could not reattach, or was shut down): the engine should exit
  kControllerLost,  // reason: the connection broke; the session keeps what it holds and
                    // reconnects (see step 5): keep serving
  kControllerBack,  // reason: a controller took this engine's Reattach; heartbeats resume
};
const char* ToString(SessionEventKind kind);

// The answer to a kReclaim in whole chunks: walks a pool of `block_count` blocks in chunks of
// `per_chunk` (the last may be shorter; 1 on the host backend) from the highest, and offers
// each chunk [first, end) that still fits in what is left of `blocks` to `take`, which
// returns whether it gave that chunk up (all of it, or nothing). Returns the blocks given up.
uint32_t TakeWholeChunks(uint32_t block_count, uint32_t per_chunk, uint32_t blocks,
                         const std::function<bool(uint32_t first, uint32_t end)>& take);

struct SessionEvent {
  SessionEventKind kind = SessionEventKind::kStop;
  uint64_t epoch = 0;
  std::vector<MappedExtent> extents = {};  // kPromoted, kGranted
  uint32_t blocks = 0;                     // kReclaim
  Duration timeout = {};                   // kDrain
  // kDrain: a next primary follows (a switch-over, an upgrade), so keyed requests may be handed
  // over to it (the router replays them there); false: none does (`batonctl drain`, protocol
  // 9): finish every request, hand nothing over.
  bool successor = true;
  std::string reason = {};  // kStop, kDisconnected, kControllerLost/Back
  // kPromoted, and kGranted of blocks that were quarantined (below): the header of every block
  // of `extents` (kBlockHeaderBytes each, in extent order) as its previous holder left it, read
  // before the scrub. A failover hands the new primary the blocks the old one wrote (their KV
  // data is not scrubbed): an engine that keeps per-block metadata there can continue the old
  // primary's sequences from their KV.
  std::vector<uint8_t> inherited_headers = {};
  // kPromoted before the predecessor's barrier (protocol 7): the predecessor's blocks,
  // quarantined until that barrier has passed, NOT mapped (`data` is nullptr: the promotion
  // reads their headers from the pool's file and maps nothing of them), their headers as they
  // were at the promotion (kBlockHeaderBytes each, in extent order; on a device pool too: the
  // records lie in the host pool blocks of the same numbers), how long the controller expects
  // the barrier to take still, and the longest the engine may wait for it before MarkServing(). A
  // write of the dead engine may still land in them: to copy what they hold, map them read-only
  // (EngineSession::MapQuarantined), copy into blocks of `extents` and check it again after the
  // copy (standby/kv/kv_handoff.h); or wait for them (WaitForInheritedBlocks); then
  // ReleaseQuarantined().
  std::vector<MappedExtent> quarantined = {};
  std::vector<uint8_t> quarantined_headers = {};
  Duration barrier_estimate = {};
  Duration wait_limit = {};
};

// How a promoted engine took the KV of its predecessor's quarantined blocks.
enum class KvInheritMode {
  kNone,    // nothing committed in them
  kCopied,  // copied into its own blocks before the barrier
  kWaited,  // a copy would have cost more than the barrier: adopted in place after it
};

struct KvInheritanceSummary {
  KvInheritMode mode = KvInheritMode::kNone;
  uint32_t blocks = 0;     // blocks holding committed KV
  uint64_t bytes = 0;      // their bytes
  double ms = 0;           // the copy, or the wait for the barrier
  double estimate_ms = 0;  // the copy as estimated
};

// What an engine adopted of its predecessor's KV (KV-warm failover).
struct KvAdoptionSummary {
  uint32_t adopted = 0;                     // sequences
  uint64_t tokens = 0;                      // tokens whose K and V they hold
  std::map<std::string, uint32_t> dropped;  // reason -> sequences not adopted
  double ms = 0;                            // time spent reading the records
};

class EngineSession {
 public:
  // Step 1 above; returns once the engine is a registered, half-started standby.
  static Result<std::unique_ptr<EngineSession>> Connect(const EngineSessionOptions& options);
  ~EngineSession();
  EngineSession(const EngineSession&) = delete;
  EngineSession& operator=(const EngineSession&) = delete;

  uint64_t engine_id() const;
  const MappedWeights& weights() const;
  const PoolView& pool() const;
  // With use_device_memory on a CUDA-backend controller: the device copy of the weights
  // (mapped READ; tensor t at address + (t.data - weights().base)) and the device pool (block
  // b at address + b x pool().block_bytes, mapped READWRITE in whole chunks while this engine
  // holds blocks in them; headers scrubbed like the host blocks'). nullopt otherwise.
  std::optional<DeviceRegionView> device_weights() const;
  std::optional<DeviceRegionView> device_pool() const;
  // Blocks per device pool chunk on a CUDA-backend controller (whether this engine took the
  // device memory or declined it), else 1. The ledger lends that pool by whole chunks (the
  // driver maps whole chunks), so the controller can lend a returned block to another engine
  // (a canary) only
  // once every block of its chunk is returned: answer a kReclaim with whole chunks (blocks
  // [c x n, (c + 1) x n), the last chunk may be shorter), at most the blocks asked for;
  // blocks of a chunk this engine keeps come back only to it.
  uint32_t reclaim_chunk_blocks() const;

  // Blocks until promoted; returns the kPromoted event. Events that arrive first (other
  // than a stop or a disconnect, which fail the wait) stay queued for NextEvent(). With
  // ready_when_waiting, the first call sends StandbyReady (one that cannot be sent fails the
  // wait with FailedPrecondition: the controller is lost, and the session ends). Once
  // promoted: FailedPrecondition at once (later events come from NextEvent()).
  Result<SessionEvent> WaitForPromotion(std::optional<Duration> timeout = std::nullopt);
  // Tells the controller this engine serves traffic now (sends PromoteAck). While the
  // controller is away: OK, and the next Reattach says the engine serves.
  Status MarkServing();

  // The next event, waiting at most `timeout` (nullopt: forever; zero: just a look).
  std::optional<SessionEvent> NextEvent(std::optional<Duration> timeout = Duration::zero());

  // Asks for `blocks` more blocks; the answer arrives as a kGranted event (or the request
  // is refused with a reason). FailedPrecondition before the promotion: a standby has no
  // lease to grow.
  Status RequestBlocks(uint32_t blocks);
  // Unmaps `extents` (each inside a mapped extent) and gives them back to the controller;
  // an empty list is sent too, as the answer to a kReclaim with nothing to give. A list with
  // a block that is not mapped, or a block listed twice, is refused whole (nothing unmapped).
  // While the controller is away: unmapped and OK, the blocks not reported to anyone (the
  // next Reattach lists only what is still mapped).
  Status ReturnBlocks(std::span<const MappedExtent> extents);
  // Answer to a kDrain event: exactly one per drain, also when the drain is called off.
  // While the controller is away: OK, and the next Reattach says the engine is drained.
  // FailedPrecondition when every kDrain received is answered already (no drain pending).
  Status ReportDrained(uint32_t unfinished);
  // After the promotion: tells the controller what this engine adopted of the KV its
  // predecessor left in the promoted blocks (shown in `batonctl timeline`). OK without
  // sending anything to a controller older than protocol 6.
  Status ReportKvAdoption(const KvAdoptionSummary& summary);
  // After a promotion before the barrier (SessionEvent::quarantined): waits at most `timeout`
  // for the Grant of the quarantined blocks, which comes once their barrier has passed, and
  // returns that kGranted event (with inherited_headers); other events stay queued.
  // DeadlineExceeded after the timeout; FailedPrecondition when told to stop or disconnected;
  // NotFound at once when the controller said they will not come (an empty Quarantined after
  // the Promote: a restarted controller that cannot account for them).
  Result<SessionEvent> WaitForInheritedBlocks(Duration timeout);
  // After a promotion before the barrier: maps the quarantined blocks whose headers the
  // promotion read READ-ONLY at their place in the pool range and returns them with `data`
  // set (an engine that copies their KV calls it once it knows there is some to copy). On a
  // device pool the device chunks that hold them are mapped READ as well, at their place in
  // device_pool() (a device-to-device copy reads them there); a driver that refuses read-only
  // access fails it. Mapped already: the same extents again.
  Result<std::vector<MappedExtent>> MapQuarantined();
  // The same for the listed quarantined blocks alone (block b at pool().BlockData(b)): an
  // engine maps the blocks whose headers show a record, and no page of the others is touched.
  // Consecutive blocks are mapped as one run. FailedPrecondition for a block that is not in
  // quarantine, for one granted meanwhile (its barrier passed: the Grant mapped it writable,
  // and WaitForInheritedBlocks returns the headers its dead engine left).
  Status MapQuarantined(std::span<const uint32_t> blocks);
  // Unmaps the read-only view of the quarantined blocks (those not granted yet), if mapped.
  // Call it once done with them: after a copy, or after the wait. On a device pool every copy
  // out of them must have finished first (synchronize its stream): an unmap under a running
  // kernel faults it.
  void ReleaseQuarantined();
  // After a promotion before the barrier: how the engine took the quarantined blocks' KV
  // (shown in `batonctl timeline`). OK without sending anything to a controller older than
  // protocol 7.
  Status ReportKvInheritance(const KvInheritanceSummary& summary);
  // True from the moment a Resume arrives until its kResume event is taken: an engine still
  // waiting for its in-flight requests to finish can stop waiting and report drained at once.
  bool resume_pending() const;
  // Reports an asynchronous error; the controller fences this engine at once. The engine
  // should stop writing to the pool and expect to be killed. While the controller is away:
  // Unavailable, and the error is reported to the controller the session reattaches to.
  Status ReportError(const Status& error);
  // The engine's compute progress, for the controller's check of a compute that hangs while
  // the heartbeat thread goes on: `steps_done` counts the compute steps finished so far (it
  // must never go back), `work_pending` the requests admitted and not finished. Call it after
  // every step and whenever the pending count changes (a request admitted before the first
  // step of a long prefill). Two relaxed atomic stores, no lock and no system call: cheap
  // enough for every step, from any thread. The heartbeat thread sends the latest values with
  // each heartbeat (proto::Progress) to a controller of protocol 11 or later (an engine
  // without handles_resume speaks protocol 2 and sends none); an engine that never calls it
  // is never judged by its progress. The controller fences a primary whose
  // steps stand still with work pending for its compute_stall_timeout_ms, which must so exceed
  // the engine's longest step.
  void ReportProgress(uint64_t steps_done, uint32_t work_pending);
  // Progress messages sent so far (for tests and diagnostics).
  uint64_t progress_sent() const;

  // The epoch this engine holds (0 while a standby).
  uint64_t epoch() const;
  // OK while this engine may keep writing: not told to stop, no error reported, and the
  // session has not ended (it stays OK while the controller is away and the session waits
  // for the next one).
  Status CheckEpoch() const;
  // Extents currently mapped writable.
  std::vector<MappedExtent> extents() const;
  // Heartbeats sent so far (for tests and diagnostics).
  uint64_t heartbeats_sent() const;
  // Changes controller_absent_timeout and on_controller_absent of the options; takes effect
  // at the heartbeat thread's next look (also during an absence that has already begun).
  void SetControllerAbsence(Duration timeout, ControllerAbsentAction action);

  // --- GPU engines (cuda/): NCCL communicators and CUDA errors -------------------------------
  // Watches an NCCL communicator the engine created (an ncclComm_t): a thread polls
  // ncclCommGetAsyncError; an asynchronous error is reported with ReportError() (the
  // controller fences at once) and the communicator aborted (ncclCommAbort); once this session
  // is fenced (told to stop, disconnected, or it reported an error) every watched communicator
  // is aborted, so collectives blocked on a dead peer return. Unavailable where
  // libnccl.so.2 cannot be loaded. `label` names it in reports.
  Status WatchNcclComm(void* comm, const std::string& label = "");
  // Stops watching `comm`; call it before ncclCommDestroy. NotFound if the watcher has
  // already aborted it (then it must not be destroyed).
  Status UnwatchNcclComm(void* comm);
  // A CUDA error the engine saw at `where` (a CUresult or cudaError_t value: the two agree on
  // every sticky error). A sticky error (the context is lost: illegal address, launch
  // failure, uncorrectable ECC, ...) is reported with ReportError(); any other is only
  // described. Returns the error as a Status ("where: CUDA_ERROR_ILLEGAL_ADDRESS (...)").
  Status ReportCudaError(int cuda_result, const std::string& where);

  // Step 6 above. Idempotent. A thread blocked in WaitForPromotion() or NextEvent() returns
  // (kDisconnected, "the session was shut down"); join such threads before destroying the
  // session.
  void Shutdown();

  class Impl;

 private:
  explicit EngineSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  Mutex nccl_mu_;
  std::unique_ptr<NcclWatcher> nccl_
      BATON_GUARDED_BY(nccl_mu_);  // created by the first WatchNcclComm()
};

}  // namespace baton
