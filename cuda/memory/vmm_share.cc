#include "cuda/memory/vmm_share.h"

#include <charconv>

#include "proto/messages.h"

namespace baton {
namespace {

constexpr uint32_t kMaxChunks = 1'000'000;

Result<uint32_t> ParseNumber(std::string_view text, std::string_view what) {
  uint32_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return InvalidArgument("VMM chunk name: " + std::string(what) + " '" + std::string(text) +
                           "' is not a number");
  }
  return value;
}

}  // namespace

std::string VmmChunkName(std::string_view region, uint32_t index, uint32_t count) {
  return std::string(region) + "[" + std::to_string(index) + "/" + std::to_string(count) + "]";
}

Result<VmmChunkRef> ParseVmmChunkName(std::string_view name) {
  const size_t open = name.rfind('[');
  const size_t slash = name.rfind('/');
  if (open == std::string_view::npos || open == 0 || slash == std::string_view::npos ||
      slash < open || name.back() != ']') {
    return InvalidArgument("VMM chunk name '" + std::string(name) + "' is not REGION[I/N]");
  }
  VmmChunkRef ref;
  ref.region = std::string(name.substr(0, open));
  BATON_ASSIGN_OR_RETURN(ref.index, ParseNumber(name.substr(open + 1, slash - open - 1), "index"));
  BATON_ASSIGN_OR_RETURN(ref.count,
                         ParseNumber(name.substr(slash + 1, name.size() - slash - 2), "count"));
  if (ref.count == 0 || ref.count > kMaxChunks || ref.index >= ref.count) {
    return InvalidArgument("VMM chunk name '" + std::string(name) + "': index " +
                           std::to_string(ref.index) + " of " + std::to_string(ref.count) +
                           " is out of range");
  }
  return ref;
}

Status SendVmmRegion(proto::Channel& channel, const VmmRegionInfo& info, std::span<const int> fds) {
  if (fds.size() != info.chunk_count || info.chunk_count == 0) {
    return InvalidArgument("region '" + info.name + "' has " + std::to_string(info.chunk_count) +
                           " chunks but " + std::to_string(fds.size()) + " fds were given");
  }
  for (uint32_t i = 0; i < info.chunk_count; ++i) {
    const int fd = fds[i];
    BATON_RETURN_IF_ERROR(
        channel.Send(proto::ShareMemory{.name = VmmChunkName(info.name, i, info.chunk_count),
                                        .size = info.chunk_bytes,
                                        .kind = static_cast<uint8_t>(proto::MemoryKind::kCudaVmm),
                                        .huge_pages = false,
                                        .writable = info.writable},
                     std::span<const int>(&fd, 1)));
  }
  return OkStatus();
}

Result<ReceivedVmmRegion> ReceiveVmmRegion(proto::Channel& channel, Duration timeout) {
  ReceivedVmmRegion out;
  for (uint32_t i = 0; out.info.chunk_count == 0 || i < out.info.chunk_count; ++i) {
    BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(timeout));
    BATON_ASSIGN_OR_RETURN(proto::ShareMemory share, msg.As<proto::ShareMemory>());
    BATON_ASSIGN_OR_RETURN(VmmChunkRef ref, ParseVmmChunkName(share.name));
    const std::string what = "VMM chunk '" + share.name + "'";
    if (share.kind != static_cast<uint8_t>(proto::MemoryKind::kCudaVmm)) {
      return InvalidArgument(what + " is not of kind CUDA VMM (" + std::to_string(share.kind) +
                             ")");
    }
    if (msg.fds.size() != 1) {
      return InvalidArgument(what + " came with " + std::to_string(msg.fds.size()) + " fds");
    }
    if (share.size == 0) return InvalidArgument(what + " has size 0");
    if (i == 0) {
      out.info = VmmRegionInfo{.name = ref.region,
                               .chunk_bytes = share.size,
                               .chunk_count = ref.count,
                               .writable = share.writable};
    }
    if (ref.region != out.info.name || ref.count != out.info.chunk_count || ref.index != i ||
        share.size != out.info.chunk_bytes || share.writable != out.info.writable) {
      return InvalidArgument(what + " does not follow chunk " + std::to_string(i) + " of region '" +
                             out.info.name + "' (" + std::to_string(out.info.chunk_count) +
                             " chunks of " + std::to_string(out.info.chunk_bytes) + " bytes)");
    }
    out.fds.push_back(std::move(msg.fds[0]));
  }
  return out;
}

Status AckVmmRegion(proto::Channel& channel, const std::string& region, const Status& outcome) {
  return channel.Send(proto::ShareMemoryAck{
      .name = region, .mapped = outcome.ok(), .detail = outcome.ok() ? "" : outcome.ToString()});
}

Status WaitVmmAck(proto::Channel& channel, const std::string& region, Duration timeout) {
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(timeout));
  BATON_ASSIGN_OR_RETURN(proto::ShareMemoryAck ack, msg.As<proto::ShareMemoryAck>());
  if (ack.name != region) {
    return InvalidArgument("expected the ack of region '" + region + "', got '" + ack.name + "'");
  }
  if (!ack.mapped)
    return FailedPrecondition("borrower refused region '" + region + "': " + ack.detail);
  return OkStatus();
}

}  // namespace baton
