// Handing a VMM region's chunks from its owner to a borrower over a proto::Channel.
//
// A region of n chunks travels as n ShareMemory messages, one fd each (SCM_RIGHTS), named
// "<region>[<i>/<n>]", kind kCudaVmm, size = chunk bytes, `writable` false for memory the
// borrower must map read-only (the weights). The borrower answers with one ShareMemoryAck
// named "<region>" once it has imported (and, for the weights, mapped) every chunk, or with
// mapped=false and the reason. ReceiveVmmRegion() checks that the chunks arrive complete, in
// order, of one size, with one fd each; anything else is InvalidArgument naming the message.
//
// No CUDA types here: the fds are opaque; cuda/memory/vmm.h imports them. Blocking calls on the
// channel's owning thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/io/unique_fd.h"
#include "base/status.h"
#include "proto/transport/channel.h"

namespace baton {

struct VmmRegionInfo {
  std::string name;
  uint64_t chunk_bytes = 0;
  uint32_t chunk_count = 0;
  bool writable = false;
};

struct ReceivedVmmRegion {
  VmmRegionInfo info;
  std::vector<UniqueFd> fds;  // one per chunk, in order
};

// "pool[3/128]".
std::string VmmChunkName(std::string_view region, uint32_t index, uint32_t count);

struct VmmChunkRef {
  std::string region;
  uint32_t index = 0;
  uint32_t count = 0;
};
// Parses VmmChunkName's format; refuses anything else (empty region, index >= count, count 0
// or above 1,000,000, trailing text).
Result<VmmChunkRef> ParseVmmChunkName(std::string_view name);

// Sends `fds` (one per chunk, in order; the caller keeps them) as the region `info`.
Status SendVmmRegion(proto::Channel& channel, const VmmRegionInfo& info, std::span<const int> fds);

// Receives one whole region; each message must arrive within `timeout` of the previous one.
Result<ReceivedVmmRegion> ReceiveVmmRegion(proto::Channel& channel, Duration timeout);

// Borrower -> owner: the region was (or could not be) taken.
Status AckVmmRegion(proto::Channel& channel, const std::string& region, const Status& outcome);
// Owner: waits for the borrower's ack of `region`; a refusal comes back as its reason.
Status WaitVmmAck(proto::Channel& channel, const std::string& region, Duration timeout);

}  // namespace baton
