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
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/status.h"
#include "proto/payload_archive.h"

namespace baton::proto {

// The protocol version range this build speaks (negotiated by Hello, see proto/hello.h).
inline constexpr uint16_t kProtocolVersionMin = 1;
inline constexpr uint16_t kProtocolVersionMax = 1;

// X(name, number). 1-15: session; 16-31: memory hand-off; 32 and up: engine lifecycle.
#define BATON_PROTO_MESSAGES(X) \
  X(Hello, 1)                   \
  X(HelloAck, 2)                \
  X(HelloReject, 3)             \
  X(ErrorMsg, 4)                \
  X(Heartbeat, 5)               \
  X(ShareMemory, 16)            \
  X(ShareMemoryAck, 17)         \
  X(TensorTable, 18)

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

// Client -> server, first message on every connection.
struct Hello {
  static constexpr MsgType kType = MsgType::kHello;
  uint16_t min_version = kProtocolVersionMin;
  uint16_t max_version = kProtocolVersionMax;
  std::string peer_name = {};     // e.g. "engine-primary", "batonctl"
  std::string role = {};          // "engine", "cli", "router", ...
  std::string launch_token = {};  // secret the controller gave a child it launched; may be empty
  template <class A>
  void serialize(A& ar) {
    ar(min_version, max_version, peer_name, role, launch_token);
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

// Engine -> controller, every heartbeat interval; also the controller's reply to a health
// request. `epoch` is the sender's current fencing epoch.
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
