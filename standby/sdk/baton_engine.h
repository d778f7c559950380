/* baton_engine.h: the C ABI of the Baton engine SDK, for engines written in other languages
 * (Python through ctypes, Go through cgo, Rust through bindgen).
 *
 * It wraps baton::EngineSession (standby/sdk/engine_sdk.h) one to one:
 *   baton_engine_connect()        connect + register + map weights read-only + reserve pool
 *   baton_engine_wait_promotion() block until promoted; extents are mapped writable
 *   baton_engine_mark_serving()   tell the controller this engine serves
 *   baton_engine_next_event()     later grants, reclaim, drain, resume and stop requests
 *   baton_engine_report_error()   an asynchronous device error: the controller fences at once
 *   baton_engine_report_progress()  compute steps done and requests pending, every step
 *   baton_engine_set_controller_absent()  what to do when the controller stays away
 *   baton_engine_close()          shut down cleanly and free the handle
 * and for GPU engines (docs/gpu.md):
 *   baton_engine_register_nccl_comm()  watch an NCCL communicator for asynchronous errors
 *   baton_engine_report_cuda_error()   a CUDA error code; sticky ones fence the engine
 *   baton_engine_connect_flags()       connect with BATON_ENGINE_USE_DEVICE_MEMORY
 *   baton_engine_device_weights()      the controller's device copy of the weights
 *   baton_engine_device_pool()         the device KV pool
 * and for KV-warm failover (a promoted engine continues its predecessor's sequences from the
 * KV they left in the pool; docs/architecture.md, "KV-warm failover"):
 *   baton_engine_event_headers()          the block headers a PROMOTED / GRANTED event inherited
 *   baton_engine_quarantined()            the predecessor's blocks still in quarantine
 *   baton_engine_wait_inherited_blocks()  wait for their Grant (after their barrier)
 *   baton_engine_release_quarantined()    done reading them
 *   baton_engine_report_kv_adoption()     / _report_kv_inheritance(): what was adopted, and how
 *   baton_engine_crc32c()                 the checksum of the KV records (standby/kv/kv_record.h)
 *
 * Conventions: functions return 0 on success and a positive baton::StatusCode value on
 * failure (1 invalid argument, 4 failed precondition, 6 unavailable, 8 deadline exceeded,
 * ...); baton_engine_last_error() then returns the message (thread-local, valid until the
 * next call on the same thread). Pointers returned (tensor data, names, block memory) stay
 * valid until baton_engine_close(), block memory until its extent is returned. Timeouts are
 * in milliseconds; a negative timeout, or one over a year, waits forever. No C++ exception
 * leaves a function: one inside (out of memory, no thread or descriptor left) is returned
 * as 10 (internal) with its text. Every function is thread-safe on one handle, except
 * baton_engine_close(), which must be the last call.
 *
 * When the controller goes away (it crashed, or a newer version replaces it), an engine
 * connected with BATON_ENGINE_HANDLES_RESUME keeps its weights and blocks and serves on
 * (baton_engine_check_epoch() stays 0) while the SDK reconnects and reattaches to the next
 * controller (engine_sdk.h, step 5). Meanwhile request_blocks and report_error return 6
 * (unavailable); return_blocks, mark_serving and report_drained return 0 (the next
 * controller is told what is mapped and what the engine is doing). The session ends with
 * STOP when the next controller refuses the engine, and with DISCONNECTED when it gives up
 * waiting (baton_engine_set_controller_absent()): exit then. Without BATON_ENGINE_HANDLES_RESUME
 * (protocol 2, which cannot reattach) a lost controller is DISCONNECTED at once.
 */
#ifndef BATON_STANDBY_BATON_ENGINE_H_
#define BATON_STANDBY_BATON_ENGINE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 3: BATON_EVENT_RESUME and baton_engine_resume_pending().
 * 4: reattaching to a restarted controller, BATON_EVENT_CONTROLLER_LOST / _BACK (with
 *    BATON_ENGINE_CONTROLLER_EVENTS), baton_engine_set_controller_absent().
 * 5: KV-warm failover: baton_engine_event_headers(), baton_engine_quarantined(),
 *    baton_engine_wait_inherited_blocks(), baton_engine_release_quarantined(),
 *    baton_engine_report_kv_adoption(), baton_engine_report_kv_inheritance(),
 *    baton_engine_crc32c().
 * 6: the quarantined blocks are not mapped at the promotion (their `data` is NULL, their
 *    headers are read from the pool's file): baton_engine_map_quarantined() maps them.
 * 7: baton_engine_map_quarantined() on a device pool maps the device chunks that hold them
 *    too (READ), for a device-to-device copy of their KV.
 * 8: BATON_ENGINE_READY_WHEN_WAITING.
 * 9: baton_engine_drain_has_successor().
 * 10: baton_engine_report_progress(). */
#define BATON_ENGINE_ABI_VERSION 10

/* Marks the exported functions: libbaton_engine.so is built with hidden visibility and
 * exports these alone. */
#if defined(__GNUC__)
#define BATON_ENGINE_API __attribute__((visibility("default")))
#else
#define BATON_ENGINE_API
#endif

typedef struct baton_engine baton_engine;

typedef struct baton_engine_options {
  /* NULL or "" for each of the first three: taken from BATON_SOCKET, BATON_LAUNCH_TOKEN and
   * BATON_ENGINE_ID in the environment. */
  const char* socket_path;
  const char* launch_token;
  uint64_t engine_id;
  const char* engine_version; /* shown by `batonctl status`; may be NULL */
  const char* http_address;   /* published in the route table; may be NULL */
  int prefault_weights;       /* nonzero: touch every arena page before reporting ready */
  int connect_timeout_ms;     /* <= 0: 10000 */
} baton_engine_options;

typedef struct baton_tensor {
  const char* name;
  uint8_t dtype; /* weightcache/safetensors/dtype.h value: 1 F64, 2 F32, 3 F16, 4 BF16, ... */
  size_t ndim;
  const int64_t* shape;
  const void* data; /* read-only */
  uint64_t size;    /* bytes */
} baton_tensor;

typedef struct baton_pool_info {
  uint32_t block_count;
  uint64_t block_bytes;
  void* base; /* reserved range: block b at base + b * block_bytes */
  uint64_t reserved_bytes;
  int huge_pages;
} baton_pool_info;

typedef struct baton_extent {
  uint32_t first;
  uint32_t count;
  void* data; /* first block's memory, mapped read-write */
  uint64_t bytes;
} baton_extent;

typedef enum baton_event_kind {
  BATON_EVENT_NONE = 0, /* no event within the timeout */
  BATON_EVENT_PROMOTED = 1,
  BATON_EVENT_GRANTED = 2,
  BATON_EVENT_RECLAIM = 3,
  BATON_EVENT_DRAIN = 4,
  BATON_EVENT_STOP = 5,
  BATON_EVENT_DISCONNECTED = 6,
  BATON_EVENT_RESUME = 7, /* the drain is called off: admit requests again */
  /* Only with BATON_ENGINE_CONTROLLER_EVENTS (an engine built for ABI 3 never sees them): */
  BATON_EVENT_CONTROLLER_LOST = 8, /* the controller went away (reason): serve on */
  BATON_EVENT_CONTROLLER_BACK = 9  /* a controller took this engine back (reason) */
} baton_event_kind;

#define BATON_EVENT_MAX_EXTENTS 64
#define BATON_EVENT_REASON_BYTES 256

typedef struct baton_event {
  baton_event_kind kind;
  uint64_t epoch;
  uint32_t extent_count; /* PROMOTED, GRANTED: extents[0..extent_count) */
  int extents_truncated; /* nonzero if more than BATON_EVENT_MAX_EXTENTS arrived; the rest
                            are listed by baton_engine_extents() */
  baton_extent extents[BATON_EVENT_MAX_EXTENTS];
  uint32_t blocks;                       /* RECLAIM */
  int64_t timeout_ms;                    /* DRAIN */
  char reason[BATON_EVENT_REASON_BYTES]; /* STOP, DISCONNECTED, CONTROLLER_*; NUL-terminated */
} baton_event;
/* `epoch`: for PROMOTED and GRANTED the epoch they came with; for STOP the epoch this engine
 * held when told to stop (0 for a standby never promoted). */

/* A device region on the CUDA backend (CUdeviceptr values). */
typedef struct baton_device_region {
  int device;       /* CUDA device ordinal */
  uint64_t address; /* start of the range in this process */
  uint64_t bytes;
  uint64_t chunk_bytes; /* the pool is mapped in whole chunks */
  uint32_t chunks;
} baton_device_region;

/* baton_engine_connect_flags(): take the device memory of a CUDA-backend controller (an
 * engine that computes on the GPU). Without it the engine declines the device regions. */
#define BATON_ENGINE_USE_DEVICE_MEMORY 1u
/* baton_engine_connect_flags(): the engine handles BATON_EVENT_RESUME (admits requests again
 * after a drain is called off). Without it the controller never calls its drain off: a
 * switch-over whose standby fails retires it once drained. */
#define BATON_ENGINE_HANDLES_RESUME 2u
/* baton_engine_connect_flags(): baton_engine_next_event() delivers BATON_EVENT_CONTROLLER_LOST
 * and BATON_EVENT_CONTROLLER_BACK (for the engine's logs). Without it they are skipped. */
#define BATON_ENGINE_CONTROLLER_EVENTS 4u
/* baton_engine_connect_flags(): the standby says it is ready (StandbyReady) at its first
 * baton_engine_wait_promotion(), not when the connect returns: an engine that builds its
 * model on the mapped weights after connecting (a PyTorch engine) is counted a ready standby
 * only once a promotion would find it waiting. Until then the controller shows it
 * registering; its engine.register_timeout_ms bounds the time to that first wait. A
 * controller lost before then ends the session (BATON_EVENT_DISCONNECTED): the next one
 * launches another standby. */
#define BATON_ENGINE_READY_WHEN_WAITING 8u

/* baton_engine_set_controller_absent() actions. */
#define BATON_ON_CONTROLLER_ABSENT_SERVE 0 /* keep serving and keep reconnecting */
#define BATON_ON_CONTROLLER_ABSENT_STOP 1  /* end the session: DISCONNECTED, check_epoch fails */

/* The ABI version this library implements (BATON_ENGINE_ABI_VERSION). */
BATON_ENGINE_API int baton_engine_abi_version(void);
/* The message of this thread's last failed call ("" if none). */
BATON_ENGINE_API const char* baton_engine_last_error(void);

/* Connects, registers and becomes a half-started standby. `options` may be NULL (all from
 * the environment). What to do when the controller stays away is read from
 * BATON_CONTROLLER_ABSENT_TIMEOUT_MS and BATON_ON_CONTROLLER_ABSENT ("serve" or "stop") when
 * set (a malformed value fails the call, naming the variable); by default the engine serves
 * on for as long as the controller is away. On success *out is the handle. */
BATON_ENGINE_API int baton_engine_connect(const baton_engine_options* options, baton_engine** out);
/* baton_engine_connect() with flags (BATON_ENGINE_USE_DEVICE_MEMORY,
 * BATON_ENGINE_HANDLES_RESUME, BATON_ENGINE_CONTROLLER_EVENTS,
 * BATON_ENGINE_READY_WHEN_WAITING). With device memory on
 * a CUDA-backend controller, the weights' device copy is mapped read-only and the device pool's
 * range reserved before this returns; a device that cannot be used fails the call. */
BATON_ENGINE_API int baton_engine_connect_flags(const baton_engine_options* options, unsigned flags,
                                                baton_engine** out);
/* After `timeout_ms` without a controller (0: never decide), `action`
 * (BATON_ON_CONTROLLER_ABSENT_SERVE or _STOP) decides; replaces what the environment said,
 * also during an absence already under way. A setter rather than a field of
 * baton_engine_options, whose size ABI 3 engines fix. 1 (invalid argument) for a negative
 * timeout or an unknown action. */
BATON_ENGINE_API int baton_engine_set_controller_absent(baton_engine* engine, int64_t timeout_ms,
                                                        int action);
/* The device copy of the weights (tensor t at address + (t.data - baton_engine_weights_base()),
 * the host arena's offsets) and the device pool (block b at address + b * block_bytes; the
 * chunks holding granted blocks are mapped read-write, their headers scrubbed). 2 (not
 * found) when this engine has no device memory: a host-backend controller, or connected
 * without BATON_ENGINE_USE_DEVICE_MEMORY. */
BATON_ENGINE_API int baton_engine_device_weights(const baton_engine* engine,
                                                 baton_device_region* out);
BATON_ENGINE_API int baton_engine_device_pool(const baton_engine* engine, baton_device_region* out);
/* Shuts the session down (unmaps everything, closes the connection) and frees the handle. */
BATON_ENGINE_API void baton_engine_close(baton_engine* engine);

BATON_ENGINE_API uint64_t baton_engine_id(const baton_engine* engine);
BATON_ENGINE_API uint64_t baton_engine_epoch(const baton_engine* engine);
/* 0 while this engine may keep writing to its blocks. */
BATON_ENGINE_API int baton_engine_check_epoch(const baton_engine* engine);

BATON_ENGINE_API size_t baton_engine_tensor_count(const baton_engine* engine);
/* Fills *out with tensor `index` (0-based, sorted by name). */
BATON_ENGINE_API int baton_engine_tensor(const baton_engine* engine, size_t index,
                                         baton_tensor* out);
/* Fills *out with the tensor called `name`; 2 (not found) if there is none. */
BATON_ENGINE_API int baton_engine_find_tensor(const baton_engine* engine, const char* name,
                                              baton_tensor* out);
BATON_ENGINE_API int baton_engine_pool(const baton_engine* engine, baton_pool_info* out);
/* The start of the read-only weight arena every tensor's data lies in (NULL for a NULL
 * engine): a tensor's offset in the arena, and so in the device copy of the weights, is
 * (const char*)t.data - (const char*)baton_engine_weights_base(engine). */
BATON_ENGINE_API const void* baton_engine_weights_base(const baton_engine* engine);

/* Waits to be promoted; *out gets the PROMOTED event. 4 (failed precondition) when told to
 * stop, disconnected, fenced, or already promoted (take later events with
 * baton_engine_next_event()); 8 (deadline exceeded) after the timeout. */
BATON_ENGINE_API int baton_engine_wait_promotion(baton_engine* engine, int64_t timeout_ms,
                                                 baton_event* out);
BATON_ENGINE_API int baton_engine_mark_serving(baton_engine* engine);
/* The next event; out->kind is BATON_EVENT_NONE when none came within the timeout. */
BATON_ENGINE_API int baton_engine_next_event(baton_engine* engine, int64_t timeout_ms,
                                             baton_event* out);

/* Asks for `blocks` more blocks (a GRANTED event answers). 4 (failed precondition) before the
 * promotion: a standby has no lease to grow. */
BATON_ENGINE_API int baton_engine_request_blocks(baton_engine* engine, uint32_t blocks);
/* Returns `count` extents ({first, count}; data and bytes are ignored); count 0 answers a
 * RECLAIM with nothing to give. A RECLAIM asks for up to `blocks` blocks. With the device
 * pool mapped, answer it with whole chunks (chunk_bytes / block_bytes blocks each,
 * chunk-aligned, the last one possibly shorter): the controller lends a block to another
 * engine only once its chunk is wholly returned. */
BATON_ENGINE_API int baton_engine_return_blocks(baton_engine* engine, const baton_extent* extents,
                                                size_t count);
/* Answers a DRAIN event: exactly one call per drain, also when a RESUME follows it. 4 (failed
 * precondition) when no drain is pending (none came, or each is answered already). */
BATON_ENGINE_API int baton_engine_report_drained(baton_engine* engine, uint32_t unfinished);
/* 1 from the moment the controller calls the drain off until the RESUME event is taken: an
 * engine still waiting for its requests can stop waiting and report drained at once. */
BATON_ENGINE_API int baton_engine_resume_pending(const baton_engine* engine);
/* The engine's compute progress: `steps_done` compute steps finished so far (never going
 * back), `work_pending` requests admitted and not finished. Call it after every step and when
 * a request is admitted; it stores two numbers (no lock, no system call) that the heartbeat
 * thread sends to the controller with each heartbeat. The controller fences a primary whose
 * steps stand still while work is pending for its compute_stall_timeout_ms (longer than the
 * engine's longest step); an engine that never calls it is not judged by it. Sent only to a
 * controller of protocol 11 or later, and only by an engine connected with
 * BATON_ENGINE_HANDLES_RESUME (without it the SDK speaks protocol 2). 0, or 1 for a NULL
 * engine. */
BATON_ENGINE_API int baton_engine_report_progress(baton_engine* engine, uint64_t steps_done,
                                                  uint32_t work_pending);
/* For the latest DRAIN event taken: 1 when a next primary follows it (a switch-over, an
 * upgrade), so keyed requests may be handed over to it (the router replays them there); 0 when
 * none does (`batonctl drain` takes the pair out of service): finish every request. */
BATON_ENGINE_API int baton_engine_drain_has_successor(const baton_engine* engine);
/* Reports an asynchronous error (`code` a StatusCode value, 0 means internal). */
BATON_ENGINE_API int baton_engine_report_error(baton_engine* engine, int code, const char* message);

/* Copies up to `capacity` currently mapped extents to `out`; returns how many are mapped. */
BATON_ENGINE_API size_t baton_engine_extents(const baton_engine* engine, baton_extent* out,
                                             size_t capacity);

/* --- GPU engines ---------------------------------------------------------------------------- */

/* Watches `comm` (an ncclComm_t the engine created) from an SDK thread that polls
 * ncclCommGetAsyncError: an asynchronous error is reported to the controller (which fences
 * this engine at once) and the communicator aborted with ncclCommAbort; once the engine is
 * fenced (told to stop, disconnected, or it reported an error) every watched communicator is
 * aborted, so collectives blocked on a dead peer return. An aborted communicator must not be
 * used or destroyed. `label` (may be NULL) names it in reports. 6 (unavailable) where
 * libnccl.so.2 cannot be loaded. */
BATON_ENGINE_API int baton_engine_register_nccl_comm(baton_engine* engine, void* comm,
                                                     const char* label);
/* Stops watching `comm`; call it before ncclCommDestroy. 2 (not found) if the watcher has
 * already aborted it. */
BATON_ENGINE_API int baton_engine_unregister_nccl_comm(baton_engine* engine, void* comm);
/* A CUDA error the engine saw at `where` (may be NULL): a CUresult or cudaError_t value (the
 * two agree on every sticky error). A sticky error (illegal address, launch failure,
 * uncorrectable ECC, ...: the context is lost) is reported to the controller, which fences
 * this engine. Returns 0 for cuda_result 0, else the error's StatusCode (10 internal for a
 * sticky error), with its description ("where: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory
 * access was encountered)") in baton_engine_last_error(). */
BATON_ENGINE_API int baton_engine_report_cuda_error(baton_engine* engine, int cuda_result,
                                                    const char* where);

/* --- KV-warm failover ------------------------------------------------------------------------ */

/* Copies to `out` (up to `capacity` bytes) the block headers the latest PROMOTED or GRANTED
 * event taken on this handle came with (by baton_engine_wait_promotion(),
 * baton_engine_next_event() or baton_engine_wait_inherited_blocks()): 64 bytes per block of
 * its extents, in extent order, as the block's previous holder left them before the SDK
 * scrubbed them; none for a grant of blocks nobody held. Returns the bytes there are (call
 * with capacity 0 to size the buffer). */
BATON_ENGINE_API size_t baton_engine_event_headers(baton_engine* engine, void* out,
                                                   size_t capacity);

/* The predecessor's blocks the PROMOTED event left in quarantine (a promotion before the dead
 * primary's barrier, protocol 7): read-only until their barrier has passed, when they come in
 * a GRANTED event. `data` is NULL until baton_engine_map_quarantined() maps them read-only
 * (on a device pool `data` is the host pool block that holds the block's KV record and `bytes`
 * is 0: the KV itself is at the device pool's address + block x block_bytes). A write of the dying
 * engine may still land in them: a copy of what they hold must be checked again after it
 * (standby/kv/kv_handoff.h). Copies up to `capacity` extents to `out` and, when not NULL, their
 * headers as of the promotion (64 bytes per block) to `headers` (up to `header_capacity` bytes),
 * the controller's estimate of the barrier's remaining time to `barrier_estimate_us` and the
 * longest the engine may wait for it before baton_engine_mark_serving() to `wait_limit_ms`. Returns
 * how many extents there are (0: none quarantined). */
BATON_ENGINE_API size_t baton_engine_quarantined(baton_engine* engine, baton_extent* out,
                                                 size_t capacity, void* headers,
                                                 size_t header_capacity,
                                                 int64_t* barrier_estimate_us,
                                                 int64_t* wait_limit_ms);
/* Waits at most `timeout_ms` for the GRANTED event of the quarantined blocks (their barrier
 * has passed) and fills *out with it; its headers are then baton_engine_event_headers().
 * Other events stay queued. 8 (deadline exceeded) after the timeout, 4 (failed precondition)
 * when told to stop or disconnected, 2 (not found) at once when the controller said they will
 * not come (a restarted controller that cannot account for them). */
BATON_ENGINE_API int baton_engine_wait_inherited_blocks(baton_engine* engine, int64_t timeout_ms,
                                                        baton_event* out);
/* Maps the quarantined blocks read-only, for a copy of the KV they hold: later calls of
 * baton_engine_quarantined() give their `data`. On a device pool the device chunks that hold
 * them are mapped READ as well, at their place in baton_engine_device_pool()'s range, for a
 * device-to-device copy (4, failed precondition, where the driver refuses read-only access:
 * they are never mapped writable before their grant). The promotion maps nothing of them, so
 * an engine that takes nothing from them (or waits for their grant) pays no mapping. */
BATON_ENGINE_API int baton_engine_map_quarantined(baton_engine* engine);
/* Unmaps the read-only view of the quarantined blocks not granted yet; call it once done with
 * them (after a copy, or after the wait). On a device pool every copy out of them must have
 * finished first (synchronize its stream): an unmap under a running kernel faults it. */
BATON_ENGINE_API int baton_engine_release_quarantined(baton_engine* engine);
/* Tells the controller what this engine adopted of its predecessor's KV (shown by `batonctl
 * timeline`; the controller logs "adopted N sequences"): `adopted` sequences holding `tokens`
 * tokens, `reasons[i]` -> `counts[i]` sequences dropped (i < `reason_count`), `ms` spent. */
BATON_ENGINE_API int baton_engine_report_kv_adoption(baton_engine* engine, uint32_t adopted,
                                                     uint64_t tokens, const char* const* reasons,
                                                     const uint32_t* counts, size_t reason_count,
                                                     double ms);

/* baton_engine_report_kv_inheritance() modes. */
#define BATON_KV_INHERIT_NONE 0   /* nothing committed in the quarantined blocks */
#define BATON_KV_INHERIT_COPIED 1 /* copied into the engine's own blocks before the barrier */
#define BATON_KV_INHERIT_WAITED 2 /* adopted in place after the barrier */
/* After a promotion with quarantined blocks: how the engine took their KV. */
BATON_ENGINE_API int baton_engine_report_kv_inheritance(baton_engine* engine, int mode,
                                                        uint32_t blocks, uint64_t bytes, double ms,
                                                        double estimate_ms);
/* The CRC32C (Castagnoli) of (the bytes that gave `crc`) followed by `bytes` bytes at `data`;
 * crc 0 starts a checksum. What a KV record's checksum is (standby/kv/kv_record.h). */
BATON_ENGINE_API uint32_t baton_engine_crc32c(uint32_t crc, const void* data, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* BATON_STANDBY_BATON_ENGINE_H_ */
