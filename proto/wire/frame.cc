#include "proto/wire/frame.h"

#include <cstdio>
#include <utility>

#include "proto/wire/crc32c.h"

namespace baton::proto {
namespace {

void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

// The magic as printable text where it is printable, e.g. "GET " for an HTTP client.
std::string MagicText(uint32_t magic) {
  std::string text;
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>(magic >> (8 * i));
    text += (c >= 0x20 && c < 0x7f) ? c : '.';
  }
  return text;
}

}  // namespace

void WriteFrameHeader(const FrameHeader& h, uint8_t* out) {
  PutU32(out + 0, h.magic);
  PutU16(out + 4, h.version);
  PutU16(out + 6, h.type);
  PutU32(out + 8, h.payload_length);
  PutU16(out + 12, h.fd_count);
  PutU16(out + 14, h.reserved);
  PutU32(out + 16, h.payload_crc32c);
}

FrameHeader ReadFrameHeader(const uint8_t* in) {
  FrameHeader h;
  h.magic = GetU32(in + 0);
  h.version = GetU16(in + 4);
  h.type = GetU16(in + 6);
  h.payload_length = GetU32(in + 8);
  h.fd_count = GetU16(in + 12);
  h.reserved = GetU16(in + 14);
  h.payload_crc32c = GetU32(in + 16);
  return h;
}

Result<std::string> EncodeFrame(uint16_t type, std::string_view payload, size_t fd_count,
                                size_t max_frame_size) {
  if (payload.size() > max_frame_size || payload.size() > UINT32_MAX) {
    return ResourceExhausted("frame payload of " + std::to_string(payload.size()) +
                             " bytes exceeds the limit of " + std::to_string(max_frame_size) +
                             " bytes");
  }
  if (fd_count > kMaxFdsPerFrame) {
    return InvalidArgument("frame carries " + std::to_string(fd_count) +
                           " fds, more than the limit of " + std::to_string(kMaxFdsPerFrame));
  }
  FrameHeader h;
  h.type = type;
  h.payload_length = static_cast<uint32_t>(payload.size());
  h.fd_count = static_cast<uint16_t>(fd_count);
  h.payload_crc32c = Crc32c(payload);
  std::string out(kFrameHeaderSize + payload.size(), '\0');
  WriteFrameHeader(h, reinterpret_cast<uint8_t*>(out.data()));
  out.replace(kFrameHeaderSize, payload.size(), payload);
  return out;
}

FrameDecoder::FrameDecoder(FrameDecoderOptions options) : options_(std::move(options)) {}

void FrameDecoder::Feed(std::string_view bytes) {
  if (failed()) return;
  buffer_.append(bytes.data(), bytes.size());
}

Status FrameDecoder::CheckHeader(const FrameHeader& h) const {
  if (h.magic != kFrameMagic) {
    return InvalidArgument("bad frame magic " + Hex32(h.magic) + " (\"" + MagicText(h.magic) +
                           "\"), expected \"BATN\"");
  }
  if (h.version != kFrameVersion) {
    return InvalidArgument("unsupported frame version " + std::to_string(h.version) +
                           " (this side reads version " + std::to_string(kFrameVersion) + ")");
  }
  if (h.reserved != 0) {
    return InvalidArgument("frame reserved field is " + std::to_string(h.reserved) + ", must be 0");
  }
  if (h.fd_count > kMaxFdsPerFrame) {
    return InvalidArgument("frame declares " + std::to_string(h.fd_count) +
                           " fds, more than the limit of " + std::to_string(kMaxFdsPerFrame));
  }
  if (options_.is_known_type && !options_.is_known_type(h.type)) {
    return InvalidArgument("unknown message type " + std::to_string(h.type));
  }
  if (h.payload_length > options_.max_frame_size) {
    return ResourceExhausted("frame payload of " + std::to_string(h.payload_length) +
                             " bytes exceeds the limit of " +
                             std::to_string(options_.max_frame_size) + " bytes");
  }
  return OkStatus();
}

Status FrameDecoder::Fail(Status status) {
  error_ = std::move(status);
  buffer_.clear();
  buffer_.shrink_to_fit();
  read_pos_ = 0;
  header_.reset();
  return error_;
}

void FrameDecoder::Compact() {
  if (read_pos_ == buffer_.size()) {
    buffer_.clear();
    read_pos_ = 0;
  } else if (read_pos_ > 4096 && read_pos_ * 2 > buffer_.size()) {
    buffer_.erase(0, read_pos_);
    read_pos_ = 0;
  }
}

Result<std::optional<Frame>> FrameDecoder::Next() {
  if (failed()) return error_;
  if (!header_.has_value()) {
    if (buffered() < kFrameHeaderSize) return std::optional<Frame>();
    const FrameHeader h =
        ReadFrameHeader(reinterpret_cast<const uint8_t*>(buffer_.data()) + read_pos_);
    if (Status s = CheckHeader(h); !s.ok()) return Fail(std::move(s));
    header_ = h;
  }
  const FrameHeader& h = *header_;
  if (buffered() < kFrameHeaderSize + h.payload_length) return std::optional<Frame>();
  Frame frame;
  frame.type = h.type;
  frame.fd_count = h.fd_count;
  frame.payload.assign(buffer_, read_pos_ + kFrameHeaderSize, h.payload_length);
  const uint32_t crc = Crc32c(frame.payload);
  if (crc != h.payload_crc32c) {
    return Fail(DataLoss("frame payload CRC32C mismatch: header says " + Hex32(h.payload_crc32c) +
                         ", payload of " + std::to_string(h.payload_length) + " bytes has " +
                         Hex32(crc)));
  }
  const size_t frame_size = kFrameHeaderSize + h.payload_length;
  read_pos_ += frame_size;
  consumed_ += frame_size;
  header_.reset();
  Compact();
  return std::optional<Frame>(std::move(frame));
}

Status FrameDecoder::Finish() const {
  if (failed()) return error_;
  if (buffered() == 0) return OkStatus();
  if (buffered() < kFrameHeaderSize) {
    return InvalidArgument("truncated frame: stream ended inside a frame header (" +
                           std::to_string(buffered()) + " of " + std::to_string(kFrameHeaderSize) +
                           " bytes)");
  }
  const FrameHeader h =
      ReadFrameHeader(reinterpret_cast<const uint8_t*>(buffer_.data()) + read_pos_);
  return InvalidArgument("truncated frame: stream ended inside a frame of type " +
                         std::to_string(h.type) + " (" + std::to_string(buffered()) + " of " +
                         std::to_string(kFrameHeaderSize + h.payload_length) + " bytes)");
}

}  // namespace baton::proto
