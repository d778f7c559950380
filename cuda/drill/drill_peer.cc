// The peer side of the promotion drill (cuda/drill/device_drill.h).
#include "cuda/drill/device_drill.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>

#include "cuda/device_borrower.h"
#include "cuda/kernels/kernels_ptx.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

constexpr Duration kStepTimeout = 60s;
constexpr Duration kPromoteWait = 600s;  // the owner kills a peer it no longer needs

struct PeerArgs {
  std::string role;
  std::string socket;
  std::string report;
  int device = 0;
  uint32_t header_bytes = 64;
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

// The next Promote, or nullopt when the owner says Stop instead.
Result<std::optional<proto::Promote>> WaitPromote(proto::Channel& channel) {
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, channel.Receive(kPromoteWait));
  if (msg.type == proto::MsgType::kStop) return std::optional<proto::Promote>();
  BATON_ASSIGN_OR_RETURN(proto::Promote p, msg.As<proto::Promote>());
  if (p.extents.size() != 1 || p.extents[0].first != 0 || p.extents[0].count == 0) {
    return InvalidArgument("the drill's Promote must grant one extent from block 0");
  }
  return std::optional<proto::Promote>(std::move(p));
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

Status Session(proto::Channel& channel, const PeerArgs& args) {
  const TimePoint start = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(
      proto::ClientHello(channel, {.peer_name = "drill-" + args.role, .role = "drill"}).status());
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

  BATON_ASSIGN_OR_RETURN(std::optional<proto::Promote> promote, WaitPromote(channel));
  if (!promote.has_value()) return OkStatus();
  const TimePoint promoted = RealClock::Get().Now();
  VmmView& pool = *b->view(p.name);
  const uint32_t blocks = promote->extents[0].count;
  if (pool.bytes() % blocks != 0) return InvalidArgument("blocks do not divide the pool");
  BATON_ASSIGN_OR_RETURN(PromotionPhases phases, b->Promote(p.name, pool.bytes() / blocks,
                                                            args.header_bytes, kStepTimeout));
  const double promote_ms = MsSince(promoted);
  const proto::PromoteAck ack{.epoch = promote->epoch, .blocks_mapped = blocks};
  // The standby acks as soon as it could serve; its checks come after and end with a
  // Heartbeat (seq 1) that says the report is written. The primary acks once its kernel runs.
  if (args.role == "standby") BATON_RETURN_IF_ERROR(channel.Send(ack));
  std::ofstream report(args.report, std::ios::trunc);
  report << "ready_ms=" << ready_ms << "\nimport_ms=" << w.import_ms + p.import_ms
         << "\nweights_map_ms=" << w.map_ms << "\nweights_read_only=" << (w.read_only ? 1 : 0)
         << "\nmap_calls=" << phases.map_calls << "\nmap_ms=" << phases.map_ms
         << "\naccess_ms=" << phases.access_ms << "\nscrub_ms=" << phases.scrub_ms
         << "\npromote_ms=" << promote_ms << "\nblocks=" << phases.blocks << "\n";
  if (args.role == "primary") {
    BATON_RETURN_IF_ERROR(StartSpinning(*b, pool, args.header_bytes));
  } else {
    BATON_RETURN_IF_ERROR(CheckBarrier(*b, pool, args.header_bytes, report));
    BATON_RETURN_IF_ERROR(CheckWeights(*b, *b->view(w.name)).WithContext("after the promotion"));
  }
  report.close();
  if (!report) return Status(StatusCode::kIoError, "writing the report " + args.report);
  if (args.role == "primary") {
    BATON_RETURN_IF_ERROR(channel.Send(ack));
  } else {
    BATON_RETURN_IF_ERROR(channel.Send(proto::Heartbeat{.epoch = promote->epoch, .seq = 1}));
  }
  // Wait for Stop (the standby) or for SIGKILL (the primary, with its kernel running).
  return channel.Receive(kPromoteWait).status();
}

}  // namespace

int RunDrillPeer(const std::vector<std::string>& argv) {
  if (argv.size() != 5 || (argv[0] != "primary" && argv[0] != "standby")) {
    std::fprintf(stderr, "drill peer: arguments are primary|standby SOCKET REPORT DEVICE HEADER\n");
    return 2;
  }
  PeerArgs args{.role = argv[0], .socket = argv[1], .report = argv[2]};
  args.device = std::atoi(argv[3].c_str());
  args.header_bytes = static_cast<uint32_t>(std::strtoul(argv[4].c_str(), nullptr, 10));
  boost::asio::io_context io;
  Result<proto::Channel> channel =
      proto::Connect(io, args.socket, proto::ChannelOptions{.label = "drill owner"});
  if (!channel.ok()) {
    std::fprintf(stderr, "drill %s: %s\n", args.role.c_str(), channel.status().ToString().c_str());
    return 1;
  }
  Status done = Session(*channel, args);
  if (!done.ok()) {
    std::fprintf(stderr, "drill %s: %s\n", args.role.c_str(), done.ToString().c_str());
    if (channel->is_open()) (void)channel->Send(proto::ErrorMsg::FromStatus(done));
    return 1;
  }
  return 0;
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
