// Messages: the typed content of frames, serialized with cereal's portable binary encoding.
//
// Every message is a plain struct with `static constexpr MsgType kType` and a serialize()
// that lists its fields in wire order. Encode() writes the payload of a frame; Decode()
// reads one back through PayloadInputArchive, refusing truncation, trailing bytes and length
// prefixes larger than the payload. DecodeAny() decodes a received frame by its type.
//
// To add a message: add a line to BATON_PROTO_MESSAGES (name, number; numbers are never
// reused), define the struct below, and document it in docs/protocol.md. Fields of vectors
// must not be of empty structs (the decoder bounds counts by bytes left).
// Plain values; thread-compatible.
#pragma once

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/status.h"
#include "proto/roles.h"
#include "proto/wire/payload_archive.h"

namespace baton::proto {

// The protocol version range this build speaks (negotiated by Hello, see proto/hello.h).
inline constexpr uint16_t kProtocolVersionMin = 2;
inline constexpr uint16_t kProtocolVersionMax = 11;
// The first version with Resume (a drain called off); a version-2 engine is never sent one.
inline constexpr uint16_t kProtocolVersionResume = 3;
// The first version with RouterReport (a router's per-engine outcomes, for canary judging);
// a router sends none on an older connection.
inline constexpr uint16_t kProtocolVersionRouterReport = 4;
// The first version with Reattach: an engine that outlived its controller registers again
// with what it holds. An older engine exits when its controller goes away.
inline constexpr uint16_t kProtocolVersionReattach = 5;
// The first version with KvAdopted: a promoted engine says what KV it adopted.
inline constexpr uint16_t kProtocolVersionKvAdopted = 6;
// The first version with Quarantined and KvInherited: a standby is promoted before its
// predecessor's barrier, on blocks that predecessor does not hold, and told which of its
// blocks wait in quarantine (it may copy committed KV out of them, read-only). An older
// engine's promotion waits for the barrier.
inline constexpr uint16_t kProtocolVersionQuarantine = 7;
// The first version whose RegisterAck may carry a third fd: the 4 KiB part of a partial
// weight arena, mapped right after the first fd (the huge-page part). An older engine is
// refused (Stop) when the arena is partial.
inline constexpr uint16_t kProtocolVersionPartialArena = 8;
// The first version with FinalDrain: a drain that no next primary follows (`batonctl drain`),
// so the engine finishes its requests instead of handing them over. An older engine is sent
// Drain, and may hand its requests over to a next primary that never comes.
inline constexpr uint16_t kProtocolVersionFinalDrain = 9;
// The first version with EngineStalled: a router says an engine has sent no token on any of
// its streams for its stall timeout (its compute hangs while its heartbeats go on). A router
// sends none on an older connection.
inline constexpr uint16_t kProtocolVersionEngineStalled = 10;
// The first version with Progress: an engine reports its compute steps and pending requests
// with its heartbeats, and the controller fences one whose steps stand still while work waits.
// An engine sends none on an older connection (the router's stall check then stands alone).
inline constexpr uint16_t kProtocolVersionProgress = 11;

// X(name, number). 1-15: session; 16-31: memory hand-off; 32 and up: engine lifecycle.
#define BATON_PROTO_MESSAGES(X) \
  X(Hello, 1)                   \
  X(HelloAck, 2)                \
  X(HelloReject, 3)             \
  X(ErrorMsg, 4)                \
  X(Heartbeat, 5)               \
  X(ShareMemory, 16)            \
  X(ShareMemoryAck, 17)         \
  X(TensorTable, 18)            \
  X(Register, 32)               \
  X(RegisterAck, 33)            \
  X(StandbyReady, 34)           \
  X(Promote, 35)                \
  X(PromoteAck, 36)             \
  X(Grant, 37)                  \
  X(LeaseRequest, 38)           \
  X(ReturnExtents, 39)          \
  X(Reclaim, 40)                \
  X(ErrorReport, 41)            \
  X(HealthRequest, 42)          \
  X(Drain, 43)                  \
  X(Drained, 44)                \
  X(Stop, 45)                   \
  X(InjectFault, 46)            \
  X(Subscribe, 47)              \
  X(RouteTable, 48)             \
  X(CtlRequest, 49)             \
  X(CtlReply, 50)               \
  X(Resume, 51)                 \
  X(RouterReport, 52)           \
  X(Reattach, 53)               \
  X(ReattachAck, 54)            \
  X(KeepMemory, 55)             \
  X(FetchMemory, 56)            \
  X(KeptMemory, 57)             \
  X(ReleaseMemory, 58)          \
  X(KvAdopted, 59)              \
  X(Quarantined, 60)            \
  X(KvInherited, 61)            \
  X(FinalDrain, 62)             \
  X(EngineStalled, 63)          \
  X(Progress, 64)

enum class MsgType : uint16_t {
#define BATON_PROTO_ENUM(name, number) k##name = number,
  BATON_PROTO_MESSAGES(BATON_PROTO_ENUM)
#undef BATON_PROTO_ENUM
};

// True when `type` names a message of this build.
bool IsKnownMsgType(uint16_t type);
// "Hello", or "unknown type 999".
std::string MsgTypeName(uint16_t type);
inline std::string MsgTypeName(MsgType type) { return MsgTypeName(static_cast<uint16_t>(type)); }

// Client -> server, first message on every connection. On the wire the role is its name
// (proto/roles.h); a name that is no role fails the decode, and the server refuses the peer.
struct Hello {
  static constexpr MsgType kType = MsgType::kHello;
  uint16_t min_version = kProtocolVersionMin;
  uint16_t max_version = kProtocolVersionMax;
  std::string peer_name = {};         // e.g. "engine-primary", "batonctl"
  PeerRole role = PeerRole::kEngine;  // what the client is
  std::string launch_token = {};  // secret the controller gave a child it launched; may be empty
  template <class A>
  void save(A& ar) const {
    ar(min_version, max_version, peer_name, std::string(ToString(role)), launch_token);
  }
  template <class A>
  void load(A& ar) {
    std::string name;
    ar(min_version, max_version, peer_name, name, launch_token);
    Result<PeerRole> parsed = ParsePeerRole(name);
    if (!parsed.ok()) throw std::invalid_argument(parsed.status().message());
    role = *parsed;
  }
};

// Server -> client: the version both sides will speak from now on.
struct HelloAck {
  static constexpr MsgType kType = MsgType::kHelloAck;
  uint16_t version = 0;
  std::string server_name = {};
  template <class A>
  void serialize(A& ar) {
    ar(version, server_name);
  }
};

// Server -> client: the Hello was refused; the server closes the connection after it.
struct HelloReject {
  static constexpr MsgType kType = MsgType::kHelloReject;
  std::string reason = {};
  template <class A>
  void serialize(A& ar) {
    ar(reason);
  }
};

// Either way: an operation or the connection failed. Sent before a protocol error closes a
// connection. `code` is a baton::StatusCode value.
struct ErrorMsg {
  static constexpr MsgType kType = MsgType::kErrorMsg;
  uint32_t code = 0;
  std::string message = {};
  template <class A>
  void serialize(A& ar) {
    ar(code, message);
  }
  static ErrorMsg FromStatus(const Status& status);
  // The Status it carries (an unknown or OK code reads as Internal).
  Status ToStatus() const;
};

// Engine -> controller, every heartbeat interval, and at once in answer to a HealthRequest.
// `epoch` is the sender's current fencing epoch (0 for a standby).
struct Heartbeat {
  static constexpr MsgType kType = MsgType::kHeartbeat;
  uint64_t epoch = 0;
  uint64_t seq = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, seq);
  }
};

// What kind of memory an fd sent with ShareMemory refers to.
enum class MemoryKind : uint8_t { kMemfd = 1, kCudaVmm = 2 };

// Owner -> borrower, with one fd (fd_count 1): shared memory the receiver may map.
struct ShareMemory {
  static constexpr MsgType kType = MsgType::kShareMemory;
  std::string name = {};  // names the region in logs and in the ack
  uint64_t size = 0;      // bytes the receiver maps (at most the fd's size)
  uint8_t kind = static_cast<uint8_t>(MemoryKind::kMemfd);
  bool huge_pages = false;
  bool writable = false;  // false: the receiver must map it read-only
  template <class A>
  void serialize(A& ar) {
    ar(name, size, kind, huge_pages, writable);
  }
};

// Borrower -> owner: the region named `name` was (or could not be) mapped.
struct ShareMemoryAck {
  static constexpr MsgType kType = MsgType::kShareMemoryAck;
  std::string name = {};
  bool mapped = false;
  std::string detail = {};  // why not, when mapped is false
  template <class A>
  void serialize(A& ar) {
    ar(name, mapped, detail);
  }
};

// One tensor of the weight cache arena. `dtype` is a weightcache DType value (checked by the
// receiver); offset and size are bytes within the arena.
struct TensorEntry {
  std::string name = {};
  uint8_t dtype = 0;
  std::vector<int64_t> shape = {};
  uint64_t offset = 0;
  uint64_t size = 0;
  template <class A>
  void serialize(A& ar) {
    ar(name, dtype, shape, offset, size);
  }
  bool operator==(const TensorEntry&) const = default;
};

// Controller -> engine, with the arena fd (fd_count 1): where each tensor of the model lies.
struct TensorTable {
  static constexpr MsgType kType = MsgType::kTensorTable;
  std::string model = {};
  uint64_t arena_size = 0;
  std::vector<TensorEntry> tensors = {};
  template <class A>
  void serialize(A& ar) {
    ar(model, arena_size, tensors);
  }
};

// ---- engine lifecycle (32 and up) ----------------------------------------------------------
// A run of pool blocks [first, first + count). An engine maps block b at offset
// b x block_bytes of its reserved range.
struct BlockRange {
  uint32_t first = 0;
  uint32_t count = 0;
  template <class A>
  void serialize(A& ar) {
    ar(first, count);
  }
  bool operator==(const BlockRange&) const = default;
};

// Engine -> controller, after HelloAck: who it is. engine_id is the one it was launched with.
struct Register {
  static constexpr MsgType kType = MsgType::kRegister;
  uint64_t engine_id = 0;
  std::string engine_version = {};
  std::string http_address = {};  // "127.0.0.1:8101"; published in the route table
  template <class A>
  void serialize(A& ar) {
    ar(engine_id, engine_version, http_address);
  }
};

// Controller -> engine, with two fds: [0] the weight arena (map read-only), [1] the pool; from
// protocol 8, a partial arena adds [2], its 4 KiB part, to be mapped read-only right after
// [0] (at offset size of [0]), so that tensor offsets span both.
struct RegisterAck {
  static constexpr MsgType kType = MsgType::kRegisterAck;
  uint64_t engine_id = 0;
  std::string model = {};
  uint64_t arena_size = 0;
  bool arena_huge_pages = false;
  std::vector<TensorEntry> tensors = {};
  uint32_t block_count = 0;
  uint64_t block_bytes = 0;
  bool pool_huge_pages = false;
  uint64_t reserve_bytes = 0;  // address space to reserve (PROT_NONE) for the pool
  uint32_t heartbeat_interval_ms = 100;
  // CUDA backend: the device that holds the weights' device copy and the device pool, and
  // how many VMM regions (cuda/memory/vmm_share.h) follow this message; -1 and 0 on the host
  // backend.
  int32_t device = -1;
  uint32_t device_regions = 0;
  template <class A>
  void serialize(A& ar) {
    ar(engine_id, model, arena_size, arena_huge_pages, tensors, block_count, block_bytes,
       pool_huge_pages, reserve_bytes, heartbeat_interval_ms, device, device_regions);
  }
};

// Engine -> controller: weights mapped read-only and pre-faulted, pool range reserved. The
// engine is now a half-started standby.
struct StandbyReady {
  static constexpr MsgType kType = MsgType::kStandbyReady;
  uint64_t arena_mapped_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t prefault_us = 0;
  template <class A>
  void serialize(A& ar) {
    ar(arena_mapped_bytes, reserved_bytes, prefault_us);
  }
};

// Controller -> engine: you are the primary at `epoch`; map `extents` writable.
struct Promote {
  static constexpr MsgType kType = MsgType::kPromote;
  uint64_t epoch = 0;
  std::vector<BlockRange> extents = {};
  template <class A>
  void serialize(A& ar) {
    ar(epoch, extents);
  }
};

// Engine -> controller: the promotion's extents are mapped and the engine serves.
struct PromoteAck {
  static constexpr MsgType kType = MsgType::kPromoteAck;
  uint64_t epoch = 0;
  uint32_t blocks_mapped = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, blocks_mapped);
  }
};

// Controller -> engine: more extents at `epoch` (a LeaseRequest's answer, or blocks handed
// on from a fenced holder after the barrier).
struct Grant {
  static constexpr MsgType kType = MsgType::kGrant;
  uint64_t epoch = 0;
  std::vector<BlockRange> extents = {};
  template <class A>
  void serialize(A& ar) {
    ar(epoch, extents);
  }
};

// Engine -> controller: asks for `blocks` more free blocks (all or nothing).
struct LeaseRequest {
  static constexpr MsgType kType = MsgType::kLeaseRequest;
  uint64_t epoch = 0;
  uint32_t blocks = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, blocks);
  }
};

// Engine -> controller: gives extents back; the engine has already unmapped them.
struct ReturnExtents {
  static constexpr MsgType kType = MsgType::kReturnExtents;
  uint64_t epoch = 0;
  std::vector<BlockRange> extents = {};
  template <class A>
  void serialize(A& ar) {
    ar(epoch, extents);
  }
};

// Controller -> engine: please return up to `blocks` blocks (answered by ReturnExtents).
struct Reclaim {
  static constexpr MsgType kType = MsgType::kReclaim;
  uint64_t epoch = 0;
  uint32_t blocks = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, blocks);
  }
};

// Engine -> controller: an asynchronous error (sticky device error, lost collective); the
// controller fences the engine at once. `code` is a baton::StatusCode value.
struct ErrorReport {
  static constexpr MsgType kType = MsgType::kErrorReport;
  uint64_t epoch = 0;
  uint32_t code = 0;
  std::string message = {};
  template <class A>
  void serialize(A& ar) {
    ar(epoch, code, message);
  }
};

// Controller -> engine: heartbeats went missing; answer at once with a Heartbeat.
struct HealthRequest {
  static constexpr MsgType kType = MsgType::kHealthRequest;
  uint64_t seq = 0;
  template <class A>
  void serialize(A& ar) {
    ar(seq);
  }
};

// Controller -> engine: exit now (a stale epoch, a refused registration, or shutdown).
struct Stop {
  static constexpr MsgType kType = MsgType::kStop;
  std::string reason = {};
  template <class A>
  void serialize(A& ar) {
    ar(reason);
  }
};

// Controller -> engine (`batonctl drill error`): report `message` as an asynchronous error.
struct InjectFault {
  static constexpr MsgType kType = MsgType::kInjectFault;
  std::string kind = {};  // "error"
  std::string message = {};
  template <class A>
  void serialize(A& ar) {
    ar(kind, message);
  }
};

}  // namespace baton::proto

#include "proto/control_messages.h"   // IWYU pragma: export
#include "proto/drain_messages.h"     // IWYU pragma: export
#include "proto/keeper_messages.h"    // IWYU pragma: export
#include "proto/kv_messages.h"        // IWYU pragma: export
#include "proto/progress_messages.h"  // IWYU pragma: export
#include "proto/reattach_messages.h"  // IWYU pragma: export

namespace baton::proto {

// Any message of this build.
using AnyMessage = std::variant<
#define BATON_PROTO_VARIANT(name, number) name,
    BATON_PROTO_MESSAGES(BATON_PROTO_VARIANT)
#undef BATON_PROTO_VARIANT
        std::monostate>;

// The frame payload of `msg`.
template <typename T>
Result<std::string> Encode(const T& msg) {
  try {
    std::ostringstream out(std::ios::binary);
    {
      cereal::PortableBinaryOutputArchive ar(
          out, cereal::PortableBinaryOutputArchive::Options::LittleEndian());
      ar(msg);
    }
    return std::move(out).str();
  } catch (const std::exception& e) {
    return Internal("encoding " + MsgTypeName(T::kType) + ": " + e.what());
  }
}

// Reads a T from a whole payload; an error names the message and what was wrong.
template <typename T>
Result<T> Decode(std::string_view payload) {
  T msg;
  try {
    PayloadInputArchive ar(payload);
    ar(msg);
    if (ar.remaining() != 0) {
      return InvalidArgument("malformed " + MsgTypeName(T::kType) +
                             " payload: " + std::to_string(ar.remaining()) +
                             " trailing bytes after " + std::to_string(ar.position()));
    }
  } catch (const std::exception& e) {
    return InvalidArgument("malformed " + MsgTypeName(T::kType) + " payload: " + e.what());
  }
  return msg;
}

// Decodes a payload by its frame type; unknown types are refused.
Result<AnyMessage> DecodeAny(uint16_t type, std::string_view payload);

}  // namespace baton::proto
