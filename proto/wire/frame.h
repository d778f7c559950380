// Frames: the unit on the wire of every Baton Unix-socket connection.
//
// A frame is a 20-byte little-endian header followed by the payload:
//
//   offset size field
//        0    4 magic            the bytes "BATN"
//        4    2 version          frame format version (kFrameVersion)
//        6    2 type             message type (proto/messages.h MsgType)
//        8    4 payload_length   bytes of payload that follow the header
//       12    2 fd_count         file descriptors sent with this frame (SCM_RIGHTS)
//       14    2 reserved         must be 0
//       16    4 payload_crc32c   CRC32C of the payload
//
// FrameDecoder turns a byte stream into frames incrementally. It checks every header field
// as soon as the header is complete, so an oversized frame is refused before any of its
// payload is buffered, and checks the CRC once the payload is complete. A refused frame
// leaves the decoder failed for good: the stream cannot be resynchronised, and the owner
// closes the connection. Docs: docs/protocol.md. Thread-compatible (one owner).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace baton::proto {

inline constexpr size_t kFrameHeaderSize = 20;
// "BATN" read as a little-endian u32.
inline constexpr uint32_t kFrameMagic = 0x4E544142u;
inline constexpr uint16_t kFrameVersion = 1;
// The largest payload a decoder accepts unless configured otherwise.
inline constexpr size_t kDefaultMaxFrameSize = size_t{1} << 20;
// The largest frame the controller sends and an engine accepts from it: a RegisterAck carries
// the whole tensor table, and MoE checkpoints have tens of thousands of tensors (about 100
// bytes each). Frames from engines and other peers stay within kDefaultMaxFrameSize.
inline constexpr size_t kControllerMaxFrameSize = size_t{64} << 20;
// The most file descriptors one frame may carry.
inline constexpr size_t kMaxFdsPerFrame = 16;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kFrameVersion;
  uint16_t type = 0;
  uint32_t payload_length = 0;
  uint16_t fd_count = 0;
  uint16_t reserved = 0;
  uint32_t payload_crc32c = 0;
};

// A decoded, checked frame.
struct Frame {
  uint16_t type = 0;
  uint16_t fd_count = 0;
  std::string payload;
};

// Writes `header` in wire order into `out` (kFrameHeaderSize bytes).
void WriteFrameHeader(const FrameHeader& header, uint8_t* out);
// Reads a header from kFrameHeaderSize bytes; checks nothing.
FrameHeader ReadFrameHeader(const uint8_t* in);

// Header + payload, with the CRC filled in. Refuses a payload over `max_frame_size` bytes and
// more than kMaxFdsPerFrame fds.
Result<std::string> EncodeFrame(uint16_t type, std::string_view payload, size_t fd_count = 0,
                                size_t max_frame_size = kDefaultMaxFrameSize);

struct FrameDecoderOptions {
  // Frames whose payload_length exceeds this are refused (ResourceExhausted).
  size_t max_frame_size = kDefaultMaxFrameSize;
  // When set, a frame whose type this returns false for is refused (InvalidArgument).
  std::function<bool(uint16_t)> is_known_type;
};

class FrameDecoder {
 public:
  explicit FrameDecoder(FrameDecoderOptions options = {});

  // Appends bytes received from the stream. Ignored once the decoder has failed.
  void Feed(std::string_view bytes);

  // The next complete frame, nullopt when more bytes are needed, or the reason the stream
  // was refused (then every later call returns the same error).
  Result<std::optional<Frame>> Next();

  // The stream ended: OK when no partial frame is buffered, otherwise an error that says how
  // much of which frame arrived.
  Status Finish() const;

  // Bytes buffered that belong to frames not yet returned.
  size_t buffered() const { return buffer_.size() - read_pos_; }
  // Total bytes of all frames returned so far (the stream offset where the next one starts).
  uint64_t consumed() const { return consumed_; }
  bool failed() const { return !error_.ok(); }
  const Status& error() const { return error_; }

 private:
  Status CheckHeader(const FrameHeader& header) const;
  Status Fail(Status status);
  void Compact();

  FrameDecoderOptions options_;
  std::string buffer_;
  size_t read_pos_ = 0;
  uint64_t consumed_ = 0;
  std::optional<FrameHeader> header_;  // the checked header of the frame being assembled
  Status error_;
};

}  // namespace baton::proto
