// The owner side of the promotion drill (cuda/drill/device_drill.h).
#include "cuda/drill/device_drill.h"

#ifdef BATON_HAVE_CUDA_HEADERS

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "base/log.h"
#include "cuda/kernels/kernels.h"
#include "cuda/memory/vmm_share.h"
#include "proto/hello.h"
#include "proto/roles.h"
#include "proto/transport/listener.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

double MsSince(TimePoint start) { return MillisBetween(start, RealClock::Get().Now()); }

// One peer process: killed and reaped on destruction if still there.
class PeerProcess {
 public:
  PeerProcess() = default;
  ~PeerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      (void)Reap(10s);
    }
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  Status Spawn(const std::vector<std::string>& argv) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) return ErrnoStatus("fork", errno);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a peer never outlives its owner
      ::execv(args[0], args.data());
      std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    return OkStatus();
  }
  Status Kill() {
    if (pid_ <= 0) return FailedPrecondition("no peer process to kill");
    return ::kill(pid_, SIGKILL) == 0 ? OkStatus() : ErrnoStatus("kill", errno);
  }
  // Waits for the exit; the wait status, or DeadlineExceeded (the child is left running).
  Result<int> Reap(Duration timeout) {
    if (pid_ <= 0) return FailedPrecondition("no peer process to reap");
    const TimePoint deadline = RealClock::Get().Now() + timeout;
    while (true) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return status;
      }
      if (r < 0 && errno != EINTR) return ErrnoStatus("waitpid", errno);
      if (RealClock::Get().Now() >= deadline) {
        return DeadlineExceeded("peer " + std::to_string(pid_) + " still running");
      }
      std::this_thread::sleep_for(200us);
    }
  }
  pid_t pid() const { return pid_; }
  // Whether the process has exited (a zombie not reaped yet counts), without reaping it.
  bool Exited() const {
    siginfo_t info{};
    return pid_ > 0 &&
           ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == pid_;
  }

 private:
  pid_t pid_ = -1;
};

Result<uint64_t> ReadU64(const PrimaryContext& ctx, CUdeviceptr at) {
  uint64_t v = 0;
  BATON_RETURN_IF_ERROR(BATON_CU(ctx.driver(), cuMemcpyDtoH, &v, at, sizeof(v)));
  return v;
}

// The counter's value once it has risen past `from` (the spin kernel writes on), or its last
// value when it has not within `wait`: a loaded host may leave an emulated kernel's thread
// unscheduled for longer than one short look.
Result<uint64_t> CounterPast(const PrimaryContext& ctx, CUdeviceptr counter, uint64_t from,
                             Duration wait) {
  const TimePoint until = RealClock::Get().Now() + wait;
  BATON_ASSIGN_OR_RETURN(uint64_t now, ReadU64(ctx, counter));
  while (now <= from && RealClock::Get().Now() < until) {
    std::this_thread::sleep_for(2ms);
    BATON_ASSIGN_OR_RETURN(now, ReadU64(ctx, counter));
  }
  return now;
}

Status Share(proto::Channel& ch, const VmmRegion& region, bool writable, Duration timeout) {
  BATON_ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, region.ExportAll());
  std::vector<int> raw;
  for (const UniqueFd& fd : fds) raw.push_back(fd.get());
  BATON_RETURN_IF_ERROR(
      SendVmmRegion(ch,
                    VmmRegionInfo{.name = region.name(),
                                  .chunk_bytes = region.chunk_bytes(),
                                  .chunk_count = static_cast<uint32_t>(region.chunk_count()),
                                  .writable = writable},
                    raw));
  return WaitVmmAck(ch, region.name(), timeout);
}

struct Peer {
  PeerProcess process;
  std::optional<proto::Channel> channel;
};

// The drill's owner serves the drill's peers only (Hello role drill).
Status AdmitPeer(const proto::Hello& hello) {
  if (hello.role == proto::PeerRole::kDrill) return OkStatus();
  return FailedPrecondition(std::string("the drill's owner serves its peers only, not role '") +
                            ToString(hello.role) + "'");
}

// Starts a peer and hands it the weights and the pool; returns once it is a standby.
Status StartPeer(proto::Listener& listener, const DrillConfig& config, proto::LaunchRole role,
                 const VmmRegion& weights, const VmmRegion& pool, Peer* peer) {
  std::vector<std::string> argv = config.peer_command;
  const std::string name = ToString(role);
  for (const std::string& a : {name, listener.path(), config.work_dir + "/" + name + ".report",
                               std::to_string(config.device), std::to_string(config.header_bytes),
                               std::to_string(config.block_bytes)}) {
    argv.push_back(a);
  }
  BATON_RETURN_IF_ERROR(peer->process.Spawn(argv));
  BATON_ASSIGN_OR_RETURN(proto::Channel ch, listener.Accept(config.step_timeout));
  peer->channel.emplace(std::move(ch));
  proto::Channel& c = *peer->channel;
  BATON_RETURN_IF_ERROR(
      proto::ServerHello(
          c, {.server_name = "drill owner", .timeout = config.step_timeout, .admit = AdmitPeer})
          .status());
  BATON_RETURN_IF_ERROR(Share(c, weights, /*writable=*/false, config.step_timeout));
  BATON_RETURN_IF_ERROR(Share(c, pool, /*writable=*/true, config.step_timeout));
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage ready, c.Receive(config.step_timeout));
  return ready.As<proto::StandbyReady>().status();
}

Status Promote(Peer& peer, uint64_t epoch, proto::BlockRange extent, Duration timeout) {
  BATON_RETURN_IF_ERROR(peer.channel->Send(proto::Promote{.epoch = epoch, .extents = {extent}}));
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg, peer.channel->Receive(timeout));
  BATON_ASSIGN_OR_RETURN(proto::PromoteAck ack, msg.As<proto::PromoteAck>());
  if (ack.epoch != epoch || ack.blocks_mapped != extent.count) {
    return InvalidArgument("PromoteAck for epoch " + std::to_string(ack.epoch) + " with " +
                           std::to_string(ack.blocks_mapped) + " blocks");
  }
  return OkStatus();
}

std::map<std::string, double> ReadReport(const std::string& path) {
  std::map<std::string, double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = std::atof(line.c_str() + eq + 1);
  }
  return out;
}

// The steps after both peers are standbys: promote, kill, promote before the reap, reap,
// grant the dead primary's blocks, verify.
Status Drill(const PrimaryContext& ctx, const DrillConfig& config, CUdeviceptr counter,
             CUdeviceptr header, uint32_t blocks, uint32_t reserve, Peer& primary, Peer& standby,
             DrillResult* r) {
  const proto::BlockRange old_blocks{.first = 0, .count = blocks - reserve};
  const proto::BlockRange reserved{.first = blocks - reserve, .count = reserve};
  BATON_RETURN_IF_ERROR(Promote(primary, 1, old_blocks, config.step_timeout)
                            .WithContext(ToString(proto::LaunchRole::kPrimary)));
  const Duration look = std::min<Duration>(config.step_timeout, 5s);
  BATON_ASSIGN_OR_RETURN(uint64_t c1, CounterPast(ctx, counter, 0, look));
  BATON_ASSIGN_OR_RETURN(uint64_t c2, CounterPast(ctx, counter, c1, look));
  r->writes_crossed = c1 > 0 && c2 > c1;

  const TimePoint killed = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(primary.process.Kill());
  BATON_RETURN_IF_ERROR(
      standby.channel->Send(proto::Quarantined{.epoch = 2, .extents = {old_blocks}}));
  const TimePoint sent = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(Promote(standby, 2, reserved, config.step_timeout)
                            .WithContext(ToString(proto::LaunchRole::kStandby)));
  r->promote_rtt_ms = MsSince(sent);
  r->promotion_ms = MsSince(killed);
  BATON_ASSIGN_OR_RETURN(uint64_t at_ack, ReadU64(ctx, counter));
  r->promoted_before_exit = !primary.process.Exited();  // not reaped either way
  BATON_RETURN_IF_ERROR(primary.process.Reap(config.step_timeout).status());
  r->kill_reap_ms = MsSince(killed);
  BATON_ASSIGN_OR_RETURN(r->counter_at_kill, ReadU64(ctx, counter));
  r->writes_after_promotion = r->counter_at_kill > at_ack;
  // The barrier has passed (the reap; a GPU host's controller also waits for NVML): only now
  // do the dead primary's blocks go to the standby.
  r->reused_after_barrier = true;
  BATON_RETURN_IF_ERROR(standby.channel->Send(proto::Grant{.epoch = 2, .extents = {old_blocks}}));

  std::this_thread::sleep_for(20ms);
  BATON_ASSIGN_OR_RETURN(uint64_t after, ReadU64(ctx, counter));
  r->stale_writes_stopped = after == r->counter_at_kill && after >= c2;
  uint64_t head[8] = {};
  const size_t head_bytes = std::min<size_t>(sizeof(head), config.header_bytes);
  // The standby checks on its own after the Grant, then says its report is written.
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage done,
                         standby.channel->Receive(config.step_timeout));
  BATON_RETURN_IF_ERROR(done.As<proto::Heartbeat>().status().WithContext("standby's own checks"));
  BATON_RETURN_IF_ERROR(BATON_CU(ctx.driver(), cuMemcpyDtoH, head, header, head_bytes));
  r->headers_scrubbed = true;
  for (size_t i = 0; i < head_bytes / 8; ++i) r->headers_scrubbed &= head[i] == 0;
  r->standby = ReadReport(config.work_dir + "/standby.report");
  r->no_foreign_byte = r->standby["own_blocks_clean"] == 1 && r->standby["clean_after_grant"] == 1;
  r->kv_copy_ok = r->standby["kv_copy_ok"] == 1;
  (void)standby.channel->Send(proto::Stop{.reason = "drill done"});
  if (!standby.process.Reap(10s).ok()) (void)standby.process.Kill();
  return OkStatus();
}

}  // namespace

Status FillDrillWeights(const PrimaryContext& ctx, const VmmRegion& weights) {
  BATON_ASSIGN_OR_RETURN(
      VmmView view,
      VmmView::Reserve(ctx, weights.chunk_bytes(), weights.chunk_count(), weights.granularity()));
  BATON_RETURN_IF_ERROR(view.Borrow(weights));
  BATON_RETURN_IF_ERROR(view.MapAll({.access = VmmAccess::kReadWrite}).status());
  BATON_ASSIGN_OR_RETURN(Kernels kernels, Kernels::Load(ctx));
  BATON_ASSIGN_OR_RETURN(Stream stream, Stream::Create(ctx.driver()));
  BATON_RETURN_IF_ERROR(kernels.Fill(stream, view.base(), view.bytes() / 4, kDrillWeightSeed));
  return stream.Synchronize(120s).WithContext("filling the drill's weights");
}

Result<DrillResult> RunPromotionDrill(const PrimaryContext& ctx, const VmmRegion& weights,
                                      const DrillConfig& config) {
  if (config.peer_command.empty() || config.work_dir.empty()) {
    return InvalidArgument("drill: peer_command and work_dir are required");
  }
  if (config.block_bytes == 0 || config.header_bytes == 0 || config.header_bytes % 8 != 0 ||
      config.block_bytes < kDrillCounterOffset + 8) {
    return InvalidArgument(
        "drill: header_bytes must be a positive multiple of 8 and blocks "
        "larger than the counter offset");
  }
  BATON_RETURN_IF_ERROR(ctx.MakeCurrent());
  BATON_ASSIGN_OR_RETURN(VmmRegion pool,
                         VmmRegion::Create(ctx, {.name = "pool",
                                                 .bytes = config.pool_bytes,
                                                 .chunk_bytes = config.pool_chunk_bytes}));
  if (pool.bytes() % config.block_bytes != 0) {
    return InvalidArgument("drill: block_bytes does not divide the pool's " +
                           std::to_string(pool.bytes()) + " bytes");
  }
  BATON_ASSIGN_OR_RETURN(VmmView own, VmmView::Reserve(ctx, pool.chunk_bytes(), pool.chunk_count(),
                                                       pool.granularity()));
  BATON_RETURN_IF_ERROR(own.Borrow(pool));
  BATON_RETURN_IF_ERROR(own.MapAll({.access = VmmAccess::kReadWrite}).status());
  DrillResult r{.weight_bytes = weights.bytes(),
                .pool_bytes = pool.bytes(),
                .pool_chunks = pool.chunk_count()};
  // The socket lives in a short directory of its own: work_dir may be too long for sun_path.
  // The directory goes after the listener (which unlinks the socket), hence declared first.
  char sock_dir[] = "/tmp/baton-drill-XXXXXX";
  if (::mkdtemp(sock_dir) == nullptr) return ErrnoStatus("mkdtemp /tmp/baton-drill-XXXXXX", errno);
  struct RemoveDir {
    const char* dir;
    ~RemoveDir() { ::rmdir(dir); }
  } remove_dir{sock_dir};
  boost::asio::io_context io;
  BATON_ASSIGN_OR_RETURN(proto::Listener listener,
                         proto::Listener::Bind(io, std::string(sock_dir) + "/drill.sock"));
  Peer primary;
  Peer standby;
  BATON_RETURN_IF_ERROR(
      StartPeer(listener, config, proto::LaunchRole::kPrimary, weights, pool, &primary)
          .WithContext("starting the primary"));
  const TimePoint standby_start = RealClock::Get().Now();
  BATON_RETURN_IF_ERROR(
      StartPeer(listener, config, proto::LaunchRole::kStandby, weights, pool, &standby)
          .WithContext("starting the standby"));
  r.standby_ready_ms = MsSince(standby_start);
  const uint32_t blocks = static_cast<uint32_t>(pool.bytes() / config.block_bytes);
  // The promotion reserve: the last chunk, which the primary never holds.
  r.reserve_blocks = static_cast<uint32_t>(pool.chunk_bytes() / config.block_bytes);
  if (pool.chunk_count() < 2 || pool.chunk_bytes() % config.block_bytes != 0 ||
      r.reserve_blocks < 2) {
    return InvalidArgument("drill: the pool needs two chunks or more, each of two blocks or more");
  }
  BATON_RETURN_IF_ERROR(Drill(ctx, config, own.base() + kDrillCounterOffset, own.base(), blocks,
                              r.reserve_blocks, primary, standby, &r));
  BATON_LOG(INFO, "drill") << "promotion with " << r.weight_bytes
                           << " bytes of weights: " << r.promotion_ms
                           << " ms, before the exit: " << (r.promoted_before_exit ? "yes" : "no")
                           << " (kill+reap " << r.kill_reap_ms << " ms, promote "
                           << r.promote_rtt_ms << " ms)";
  return r;
}

}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
