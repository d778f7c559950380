// Fuzz target for the frame decoder and the message decoders behind it.
//
// The input is a byte stream as a peer could send it. It is decoded twice, all at once and in
// small pieces, and both runs must agree frame for frame. Each complete frame's payload is
// decoded by its type; the bytes after the first header are also decoded as a payload of the
// type that header names, CRC or not, so message decoding is reached without a valid CRC. A
// payload that decodes and says it is little-endian must re-encode to the same bytes.
// Nothing may crash, hang or allocate beyond the input's scale.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "proto/messages.h"
#include "proto/wire/frame.h"

namespace {

using baton::proto::AnyMessage;
using baton::proto::DecodeAny;
using baton::proto::Frame;
using baton::proto::FrameDecoder;
using baton::proto::FrameDecoderOptions;

struct Outcome {
  std::vector<Frame> frames;
  std::string error;
};

void CheckReencodes(uint16_t type, std::string_view payload) {
  baton::Result<AnyMessage> msg = DecodeAny(type, payload);
  if (!msg.ok() || payload.empty() || payload[0] != 1) return;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (!std::is_same_v<T, std::monostate>) {
          baton::Result<std::string> again = baton::proto::Encode(m);
          if (!again.ok() || *again != payload) std::abort();
        }
      },
      *msg);
}

Outcome Run(std::string_view input, size_t chunk) {
  FrameDecoderOptions options;
  options.is_known_type = baton::proto::IsKnownMsgType;
  FrameDecoder decoder(options);
  Outcome out;
  for (size_t pos = 0; pos < input.size() && out.error.empty(); pos += chunk) {
    decoder.Feed(input.substr(pos, chunk));
    while (true) {
      baton::Result<std::optional<Frame>> next = decoder.Next();
      if (!next.ok()) {
        out.error = next.status().ToString();
        break;
      }
      if (!next->has_value()) break;
      if ((*next)->payload.size() > options.max_frame_size) std::abort();
      out.frames.push_back(std::move(**next));
    }
  }
  if (out.error.empty()) {
    baton::Status end = decoder.Finish();
    if (!end.ok()) out.error = end.ToString();
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const Outcome whole = Run(input, input.size() + 1);
  const Outcome pieces = Run(input, size % 13 + 1);
  if (whole.error != pieces.error || whole.frames.size() != pieces.frames.size()) std::abort();
  for (size_t i = 0; i < whole.frames.size(); ++i) {
    const Frame& a = whole.frames[i];
    const Frame& b = pieces.frames[i];
    if (a.type != b.type || a.fd_count != b.fd_count || a.payload != b.payload) std::abort();
    CheckReencodes(a.type, a.payload);
  }
  if (size >= baton::proto::kFrameHeaderSize) {
    const uint16_t type = static_cast<uint16_t>(data[6] | (data[7] << 8));
    CheckReencodes(type, input.substr(baton::proto::kFrameHeaderSize));
  }
  return 0;
}
