// The peer side of the promotion drill (cuda/drill/device_drill.h).
#include "cuda/drill/device_drill.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include "cuda/device_borrower.h"
#include "cuda/kernels/kernels_ptx.h"
#include "proto/hello.h"
#include "proto/messages.h"
#include "proto/roles.h"
#include "proto/transport/listener.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

constexpr Duration kStepTimeout = 60s;
constexpr Duration kPromoteWait = 600s;  // the owner kills a peer it no longer needs

struct PeerArgs {
  proto::LaunchRole role = proto::LaunchRole::kStandby;
  std::string socket;
  std::string report;
  int device = 0;
  uint32_t header_bytes = 64;
  uint64_t block_bytes = 0;
};

double MsSince(TimePoint start) { return MillisBetween(start, RealClock::Get().Now()); }

Result<uint64_t> ReadU64(const DeviceBorrower& b, CUdeviceptr at) {
  uint64_t v = 0;
  const CudaDriver& cu = b.context().driver();
  BATON_RETURN_IF_ERROR(BATON_CU(cu, cuMemcpyDtoHAsync, &v, at, sizeof(v), b.stream().get()));
  BATON_RETURN_IF_ERROR(b.stream().Synchronize(kStepTimeout));
  return v;
}

// Three words of every chunk (first, middle, last) hold the weight pattern.
Status CheckWeights(const DeviceBorrower& b, const VmmView& w) {
  const CudaDriver& cu = b.context().driver();
  for (size_t c = 0; c < w.chunk_count(); ++c) {
    const uint64_t base = c * w.chunk_bytes();
    for (uint64_t off : {base, base + w.chunk_bytes() / 2, base + w.chunk_bytes() - 4}) {
      uint32_t word = 0;
      BATON_RETURN_IF_ERROR(BATON_CU(cu, cuMemcpyDtoH, &word, w.base() + off, sizeof(word)));
      const uint32_t want = FillPatternWord(off / 4, kDrillWeightSeed);
      if (word != want) {
        return DataLoss("weights byte " + std::to_string(off) + ": read " + std::to_string(word) +
                        ", the owner wrote " + std::to_string(want));
      }
    }
  }
  return OkStatus();
}

// A Promote, with the Quarantined that came before it (the standby's).
struct Promotion {
  proto::Promote promote;
  std::optional<proto::Quarantined> quarantined;
  proto::BlockRange extent() const { return promote.extents[0]; }
};

// The next Promote, or nullopt when the owner says Stop instead.
Result<std::optional<Promotion>> WaitPromote(proto::Channel& channel) {
  Promotion p;
  while (true) {
    BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(kPromoteWait));
    if (msg.type == proto::MsgType::kStop) return std::optional<Promotion>();
    if (msg.type == proto::MsgType::kQuarantined) {
      BATON_ASSIGN_OR_RETURN(p.quarantined, msg.As<proto::Quarantined>());
      continue;
    }
    BATON_ASSIGN_OR_RETURN(p.promote, msg.As<proto::Promote>());
    if (p.promote.extents.size() != 1 || p.promote.extents[0].count == 0) {
      return InvalidArgument("the drill's Promote must grant one extent");
    }
    return std::optional<Promotion>(std::move(p));
  }
}

// A device range back on the host, as 32-bit words.
Result<std::vector<uint32_t>> ReadWords(const DeviceBorrower& b, CUdeviceptr at, uint64_t bytes) {
  std::vector<uint32_t> words(bytes / 4);
  const CudaDriver& cu = b.context().driver();
  BATON_RETURN_IF_ERROR(BATON_CU(cu, cuMemcpyDtoHAsync, words.data(), at, bytes, b.stream().get()));
  BATON_RETURN_IF_ERROR(b.stream().Synchronize(kStepTimeout));
  return words;
}

// Whether the words hold FillPatternWord(i, seed) from word `from` on.
bool HoldsPattern(const std::vector<uint32_t>& words, size_t from, size_t count, uint32_t seed) {
  for (size_t i = 0; i < count; ++i) {
    if (words[from + i] != FillPatternWord(i, seed)) return false;
  }
  return true;
}

// Primary: the pool is mapped; start the spin kernel on block 0 and wait until it runs.
Status StartSpinning(const DeviceBorrower& b, const VmmView& pool, uint32_t header_bytes) {
  const CudaDriver& cu = b.context().driver();
  BATON_RETURN_IF_ERROR(b.kernels().Spin(b.stream(), pool.base() + kDrillCounterOffset, pool.base(),
                                         header_bytes / 4, UINT64_MAX / 2));
  BATON_ASSIGN_OR_RETURN(Stream watch, Stream::Create(cu));
  const TimePoint deadline = RealClock::Get().Now() + 10s;
  while (RealClock::Get().Now() < deadline) {
    uint64_t v = 0;
    BATON_RETURN_IF_ERROR(BATON_CU(cu, cuMemcpyDtoHAsync, &v, pool.base() + kDrillCounterOffset,
                                   sizeof(v), watch.get()));
    BATON_RETURN_IF_ERROR(watch.Synchronize(5s));
    if (v > 0) return OkStatus();
    std::this_thread::sleep_for(1ms);
  }
  return DeadlineExceeded("the spin kernel did not start within 10 s");
}

// Standby after its promotion: block 0's header is zero and the dead kernel writes nothing.
Status CheckBarrier(const DeviceBorrower& b, const VmmView& pool, uint32_t header_bytes,
                    std::ofstream& report) {
  std::vector<uint8_t> header(header_bytes);
  const CudaDriver& cu = b.context().driver();
  BATON_RETURN_IF_ERROR(
      BATON_CU(cu, cuMemcpyDtoHAsync, header.data(), pool.base(), header.size(), b.stream().get()));
  BATON_RETURN_IF_ERROR(b.stream().Synchronize(kStepTimeout));
  bool zero = true;
  for (uint8_t byte : header) zero = zero && byte == 0;
  BATON_ASSIGN_OR_RETURN(uint64_t c1, ReadU64(b, pool.base() + kDrillCounterOffset));
  std::this_thread::sleep_for(20ms);
  BATON_ASSIGN_OR_RETURN(uint64_t c2, ReadU64(b, pool.base() + kDrillCounterOffset));
  report << "header_zero=" << (zero ? 1 : 0) << "\ncounter_stable=" << (c1 == c2 ? 1 : 0)
         << "\ncounter=" << c2 << "\n";
  if (!zero) return DataLoss("block 0's header is not zero after the scrub");
  if (c1 != c2) {
    return DataLoss("the killed primary's kernel is still writing (" + std::to_string(c1) +
                    " then " + std::to_string(c2) + ")");
  }
  return OkStatus();
}

// The standby's own blocks: all but the last hold its pattern, the last the copy of block 1.
Status CheckOwnBlocks(const DeviceBorrower& b, const VmmView& pool, proto::BlockRange own,
                      uint64_t block_bytes, bool with_copy, bool* clean, bool* copy_ok) {
  BATON_ASSIGN_OR_RETURN(
      std::vector<uint32_t> words,
      ReadWords(b, pool.base() + own.first * block_bytes, uint64_t{own.count} * block_bytes));
  const size_t per_block = block_bytes / 4;
  const size_t filled = (own.count - (with_copy ? 1 : 0)) * per_block;
  *clean = HoldsPattern(words, 0, filled, kDrillStandbySeed);
  *copy_ok = with_copy && HoldsPattern(words, filled, per_block, kDrillKvSeed);
  return OkStatus();
}

// Standby, after its ack: its blocks but the copy's filled with its pattern (what it serves
// with), while the dead primary may still tear down.
Status FillOwn(const DeviceBorrower& b, const VmmView& pool, const Promotion& p,
               uint64_t block_bytes) {
  const proto::BlockRange own = p.extent();
  BATON_RETURN_IF_ERROR(b.kernels().Fill(b.stream(), pool.base() + own.first * block_bytes,
                                         (own.count - (p.quarantined ? 1 : 0)) * block_bytes / 4,
                                         kDrillStandbySeed));
  return b.stream().Synchronize(kStepTimeout);
}

// Standby, before the barrier and its ack: the quarantined block 1 copied device to device
// out of a READ mapping of the quarantined chunks into its last block.
Status TakeOver(const DeviceBorrower& b, VmmView& pool, const Promotion& p, uint64_t block_bytes,
                std::ofstream& report) {
  const proto::BlockRange own = p.extent();
  const CudaDriver& cu = b.context().driver();
  if (p.quarantined.has_value() && !p.quarantined->extents.empty()) {
    const proto::BlockRange q = p.quarantined->extents[0];
    const uint64_t bytes = (q.first + uint64_t{q.count}) * block_bytes;
    const uint64_t mapped =
        (bytes + pool.chunk_bytes() - 1) / pool.chunk_bytes() * pool.chunk_bytes();
    const TimePoint start = RealClock::Get().Now();
    BATON_RETURN_IF_ERROR(pool.Map(0, mapped, {.access = VmmAccess::kRead}).status());
    BATON_RETURN_IF_ERROR(BATON_CU(cu, cuMemcpyDtoDAsync,
                                   pool.base() + (own.first + own.count - 1) * block_bytes,
                                   pool.base() + block_bytes, block_bytes, b.stream().get()));
    BATON_RETURN_IF_ERROR(b.stream().Synchronize(kStepTimeout));
    BATON_RETURN_IF_ERROR(pool.Unmap(0, mapped));
    report << "kv_copy_ms=" << MsSince(start) << "\n";
  }
  return b.stream().Synchronize(kStepTimeout);
}

Status Session(proto::Channel& channel, const PeerArgs& args) {
  const TimePoint start = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(
      proto::ClientHello(channel, {.peer_name = std::string("drill-") + ToString(args.role),
                                   .role = proto::PeerRole::kDrill})
          .status());
  BATON_ASSIGN_OR_RETURN(const CudaDriver* cu, CudaDriver::Get());
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBorrower> b,
                         DeviceBorrower::Create(*cu, args.device));
  BATON_ASSIGN_OR_RETURN(AcceptedRegion w, b->AcceptRegion(channel, kStepTimeout));
  BATON_ASSIGN_OR_RETURN(AcceptedRegion p, b->AcceptRegion(channel, kStepTimeout));
  if (w.writable || !p.writable) {
    return InvalidArgument("expected a read-only region then a writable one, got '" + w.name +
                           "' and '" + p.name + "'");
  }
  BATON_RETURN_IF_ERROR(CheckWeights(*b, *b->view(w.name)));
  const double ready_ms = MsSince(start);
  BATON_RETURN_IF_ERROR(
      channel.Send(proto::StandbyReady{.arena_mapped_bytes = w.bytes,
                                       .reserved_bytes = p.bytes,
                                       .prefault_us = static_cast<uint64_t>(ready_ms * 1000)}));

  BATON_ASSIGN_OR_RETURN(std::optional<Promotion> promotion, WaitPromote(channel));
  if (!promotion.has_value()) return OkStatus();
  const TimePoint promoted = RealClock::Get().Now();
  VmmView& pool = *b->view(p.name);
  const proto::BlockRange own = promotion->extent();
  const uint64_t block_bytes = args.block_bytes;
  const uint32_t blocks = static_cast<uint32_t>(pool.bytes() / block_bytes);
  BATON_ASSIGN_OR_RETURN(PromotionPhases phases,
                         b->MapBlocks(p.name, own.first, own.count, block_bytes, blocks,
                                      args.header_bytes, kStepTimeout));
  std::ofstream report(args.report, std::ios::trunc);
  if (args.role == proto::LaunchRole::kStandby) {
    BATON_RETURN_IF_ERROR(TakeOver(*b, pool, *promotion, block_bytes, report));
  }
  const double promote_ms = MsSince(promoted);
  const proto::PromoteAck ack{.epoch = promotion->promote.epoch, .blocks_mapped = own.count};
  // The standby acks as soon as it could serve; its checks come after and end with a
  // Heartbeat (seq 1) that says the report is written. The primary acks once its kernel runs.
  if (args.role == proto::LaunchRole::kStandby) BATON_RETURN_IF_ERROR(channel.Send(ack));
  report << "ready_ms=" << ready_ms << "\nimport_ms=" << w.import_ms + p.import_ms
         << "\nweights_map_ms=" << w.map_ms << "\nweights_read_only=" << (w.read_only ? 1 : 0)
         << "\nmap_calls=" << phases.map_calls << "\nmap_ms=" << phases.map_ms
         << "\naccess_ms=" << phases.access_ms << "\nscrub_ms=" << phases.scrub_ms
         << "\npromote_ms=" << promote_ms << "\nblocks=" << phases.blocks << "\n";
  if (args.role == proto::LaunchRole::kPrimary) {
    BATON_RETURN_IF_ERROR(b->kernels().Fill(b->stream(), pool.base() + block_bytes, block_bytes / 4,
                                            kDrillKvSeed));  // block 1: "KV"
    BATON_RETURN_IF_ERROR(b->stream().Synchronize(kStepTimeout));
    BATON_RETURN_IF_ERROR(StartSpinning(*b, pool, args.header_bytes));
    report.close();
    BATON_RETURN_IF_ERROR(channel.Send(ack));
    return channel.Receive(kPromoteWait).status();  // SIGKILL, with its kernel running
  }
  // While the dead primary may still be tearing down: nothing foreign in the standby's blocks.
  BATON_RETURN_IF_ERROR(FillOwn(*b, pool, *promotion, block_bytes));
  const bool with_copy = promotion->quarantined.has_value();
  bool clean = false, copy_ok = false;
  BATON_RETURN_IF_ERROR(CheckOwnBlocks(*b, pool, own, block_bytes, with_copy, &clean, &copy_ok));
  report << "own_blocks_clean=" << (clean ? 1 : 0) << "\nkv_copy_ok=" << (copy_ok ? 1 : 0) << "\n";
  // The dead primary's blocks, granted once it is reaped: mapped, scrubbed, checked.
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(kPromoteWait));
  BATON_ASSIGN_OR_RETURN(proto::Grant grant, msg.As<proto::Grant>());
  if (grant.extents.size() != 1) return InvalidArgument("the drill's Grant must be one extent");
  BATON_RETURN_IF_ERROR(b->MapBlocks(p.name, grant.extents[0].first, grant.extents[0].count,
                                     block_bytes, blocks, args.header_bytes, kStepTimeout)
                            .status());
  BATON_RETURN_IF_ERROR(CheckBarrier(*b, pool, args.header_bytes, report));
  bool still_clean = false, unused = false;
  BATON_RETURN_IF_ERROR(
      CheckOwnBlocks(*b, pool, own, block_bytes, with_copy, &still_clean, &unused));
  report << "clean_after_grant=" << (still_clean ? 1 : 0) << "\n";
  BATON_RETURN_IF_ERROR(CheckWeights(*b, *b->view(w.name)).WithContext("after the promotion"));
  report.close();
  if (!report) return Status(StatusCode::kIoError, "writing the report " + args.report);
  if (!clean || !still_clean) return DataLoss("a foreign byte in the standby's own blocks");
  if (with_copy && !copy_ok) return DataLoss("the copy of the quarantined block 1 does not check");
  BATON_RETURN_IF_ERROR(
      channel.Send(proto::Heartbeat{.epoch = promotion->promote.epoch, .seq = 1}));
  return channel.Receive(kPromoteWait).status();  // Stop
}

}  // namespace

int RunDrillPeer(const std::vector<std::string>& argv) {
  if (argv.size() != 6) {
    std::fprintf(stderr,
                 "drill peer: arguments are primary|standby SOCKET REPORT DEVICE HEADER BLOCK\n");
    return 2;
  }
  Result<proto::LaunchRole> role = proto::ParseLaunchRole(argv[0]);
  if (!role.ok()) {
    std::fprintf(stderr, "drill peer: %s\n", role.status().message().c_str());
    return 2;
  }
  PeerArgs args{.role = *role, .socket = argv[1], .report = argv[2]};
  args.device = std::atoi(argv[3].c_str());
  args.header_bytes = static_cast<uint32_t>(std::strtoul(argv[4].c_str(), nullptr, 10));
  args.block_bytes = std::strtoull(argv[5].c_str(), nullptr, 10);
  if (args.block_bytes == 0 || args.block_bytes % 4 != 0) {
    std::fprintf(stderr, "drill peer: BLOCK must be a positive multiple of 4 bytes\n");
    return 2;
  }
  boost::asio::io_context io;
  Result<proto::Channel> channel =
      proto::Connect(io, args.socket, proto::ChannelOptions{.label = "drill owner"});
  if (!channel.ok()) {
    std::fprintf(stderr, "drill %s: %s\n", ToString(args.role),
                 channel.status().ToString().c_str());
    return 1;
  }
  Status done = Session(*channel, args);
  if (!done.ok()) {
    std::fprintf(stderr, "drill %s: %s\n", ToString(args.role), done.ToString().c_str());
    if (channel->is_open()) (void)channel->Send(proto::ErrorMsg::FromStatus(done));
    return 1;
  }
  return 0;
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
