// baton_test_engine_helper: an engine for the chaos tests, built on the engine SDK.
//
// Normal mode: registers, maps the weights, waits as a standby, and once promoted stamps
// every granted block's header (engine id, epoch, counter) every few milliseconds from its
// compute thread. Before each write it checks that the header it finds was written by itself
// in its own epoch or is scrubbed (all zero); anything else breaks fencing invariants 1/2:
// it reports the error through the SDK and writes <violations-dir>/violation-<id>.txt, which
// the tests look for. Heartbeats come from the SDK's own thread.
//
// Flags: tests/chaos/test_engine_flags.h.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "standby/sdk/engine_sdk.h"
#include "tests/chaos/device_access.h"
#include "tests/chaos/engine_worker.h"
#include "tests/chaos/rogue_engine.h"
#include "tests/chaos/test_engine_flags.h"

namespace baton {
namespace {

constexpr uint64_t kStampMagic = 0x42544e4b53544d50ull;  // "BTNKSTMP"

struct BlockStamp {
  uint64_t magic;
  uint64_t engine_id;
  uint64_t epoch;
  uint64_t counter;
};
static_assert(sizeof(BlockStamp) <= kBlockHeaderBytes);

// The rogue mode named in the file, if this process claimed it.
std::string ClaimRogueMode(const std::string& path) {
  if (path.empty()) return "";
  const std::string claimed = path + ".claimed." + std::to_string(::getpid());
  if (::rename(path.c_str(), claimed.c_str()) != 0) return "";
  std::ifstream in(claimed);
  std::string mode;
  in >> mode;
  return mode;
}

// --- the well-behaved engine ------------------------------------------------------------------

class StampWriter {
 public:
  StampWriter(EngineSession* session, const Flags& flags,
              const std::optional<testing::DeviceAccess>& device)
      : session_(session),
        flags_(flags),
        device_(device),
        fill_(session->engine_id(), session->pool().block_bytes, kBlockHeaderBytes) {}

  void Run(const std::atomic<bool>& stop) {
    while (!stop.load() && !violated_) {
      if (session_->CheckEpoch().ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        check_fill_ = flags_.fill_blocks && !device_.has_value() && ++rounds_ % 25 == 0;
        for (const MappedExtent& e : session_->extents()) StampExtent(e);
      }
      Spin();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // Serializes block returns with the writer.
  std::mutex& mu() { return mu_; }

  // A violation found outside the writer (the events' thread).
  void Report(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    Violate(what);
  }

 private:
  void StampExtent(const MappedExtent& e) {
    const uint64_t me = session_->engine_id();
    const uint64_t epoch = session_->epoch();
    for (uint32_t b = e.first; b < e.first + e.count && !violated_; ++b) {
      const std::optional<BlockStamp> read = ReadStamp(b);
      if (!read.has_value()) return;  // the device failed: reported, nothing more is checked
      const BlockStamp seen = *read;
      const bool scrubbed = seen.magic == 0 && seen.engine_id == 0 && seen.epoch == 0;
      const bool mine = seen.magic == kStampMagic && seen.engine_id == me && seen.epoch == epoch;
      if (!scrubbed && !mine) return Violation(b, seen);
      if (!FillOrCheck(b, scrubbed)) return;
      if (!WriteStamp(b, BlockStamp{kStampMagic, me, epoch, ++counter_})) return;
    }
  }

  // Block b's header: in the host pool, or through the driver in the device pool. A failed
  // device copy is no reading at all (zeros would pass for a scrubbed header): the engine
  // stops checking and reports the error, which fences it.
  std::optional<BlockStamp> ReadStamp(uint32_t b) {
    BlockStamp out{};
    if (device_.has_value()) {
      Status read = device_->Read(DeviceBlock(b), &out, sizeof(out));
      if (!read.ok()) return DeviceFailed(read), std::nullopt;
      return out;
    }
    auto* stamp = reinterpret_cast<volatile BlockStamp*>(session_->pool().BlockData(b));
    return BlockStamp{stamp->magic, stamp->engine_id, stamp->epoch, stamp->counter};
  }
  bool WriteStamp(uint32_t b, const BlockStamp& v) {
    if (device_.has_value()) {
      Status written = device_->Write(DeviceBlock(b), &v, sizeof(v));
      if (!written.ok()) DeviceFailed(written);
      return written.ok();
    }
    auto* stamp = reinterpret_cast<volatile BlockStamp*>(session_->pool().BlockData(b));
    stamp->magic = v.magic;
    stamp->engine_id = v.engine_id;
    stamp->epoch = v.epoch;
    stamp->counter = v.counter;
    return true;
  }

  void DeviceFailed(const Status& error) {
    violated_ = true;  // stops the writer
    BATON_LOG(ERROR, "test-engine") << "device copy failed: " << error.ToString();
    (void)session_->ReportError(error.WithContext("test engine's device copy"));
  }

  uint64_t DeviceBlock(uint32_t b) const {
    return session_->device_pool()->address + uint64_t{b} * session_->pool().block_bytes;
  }

  // --fill-blocks (host pool): a block new to this engine is filled whole; one it filled
  // before is checked whole now and then.
  bool FillOrCheck(uint32_t b, bool fresh) {
    if (!flags_.fill_blocks || device_.has_value()) return true;
    uint8_t* data = session_->pool().BlockData(b);
    if (fresh) {
      fill_.Fill(b, data);
      return true;
    }
    if (!check_fill_) return true;
    const std::optional<testing::ForeignWord> foreign = fill_.Check(b, data);
    if (!foreign.has_value()) return true;
    Violate("invariant violation: block " + std::to_string(b) + " holds a foreign word at byte " +
            std::to_string(foreign->offset) + ": " + std::to_string(foreign->word) + " (engine " +
            std::to_string(foreign->word >> 32) + "'s), this is engine " +
            std::to_string(session_->engine_id()) + " at epoch " +
            std::to_string(session_->epoch()));
    return false;
  }

  void Violation(uint32_t block, const BlockStamp& seen) {
    Violate("invariant violation: block " + std::to_string(block) + " holds a header of engine " +
            std::to_string(seen.engine_id) + " epoch " + std::to_string(seen.epoch) + " (magic " +
            std::to_string(seen.magic) + "), this is engine " +
            std::to_string(session_->engine_id()) + " at epoch " +
            std::to_string(session_->epoch()));
  }

  void Violate(const std::string& what) {
    violated_ = true;
    BATON_LOG(ERROR, "test-engine") << what;
    if (!flags_.violations_dir.empty()) {
      std::ofstream out(flags_.violations_dir + "/violation-" +
                        std::to_string(session_->engine_id()) + ".txt");
      out << what << "\n";
    }
    (void)session_->ReportError(Internal(what));
  }

  void Spin() const {
    if (flags_.busy_ms <= 0) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(flags_.busy_ms);
    volatile uint64_t x = 0;
    while (std::chrono::steady_clock::now() < until) x = x + 1;
  }

  EngineSession* session_;
  const Flags& flags_;
  const std::optional<testing::DeviceAccess>& device_;
  std::mutex mu_;
  uint64_t counter_ = 0;
  bool violated_ = false;
  testing::BlockFill fill_;
  uint64_t rounds_ = 0;
  bool check_fill_ = false;
};

// What to return for a Reclaim of `blocks`: whole chunks of the device pool (single blocks on
// the host), the highest first, at most `blocks` in all; as pieces of its mapped extents, as
// ReturnBlocks() takes them.
std::vector<MappedExtent> ReclaimWholeChunks(const EngineSession& session, uint32_t blocks) {
  const uint32_t per_chunk = session.reclaim_chunk_blocks();
  const std::vector<MappedExtent> mapped = session.extents();
  std::vector<bool> held(session.pool().block_count, false);
  for (const MappedExtent& e : mapped) {
    for (uint32_t b = e.first; b < e.first + e.count; ++b) held[b] = true;
  }
  std::vector<bool> give(held.size(), false);
  (void)TakeWholeChunks(static_cast<uint32_t>(held.size()), per_chunk, blocks,
                        [&](uint32_t first, uint32_t end) {
                          for (uint32_t b = first; b < end; ++b) {
                            if (!held[b]) return false;
                          }
                          for (uint32_t b = first; b < end; ++b) give[b] = true;
                          return true;
                        });
  std::vector<MappedExtent> out;
  for (const MappedExtent& e : mapped) {
    for (uint32_t b = e.first; b < e.first + e.count; ++b) {
      if (!give[b]) continue;
      if (!out.empty() && out.back().first + out.back().count == b && b != e.first) {
        ++out.back().count;
      } else {
        out.push_back(MappedExtent{.first = b, .count = 1});
      }
    }
  }
  return out;
}

// The blocks of a fenced engine, granted once past its barrier: no worker of another engine
// may still run (the cgroup it shared with that engine is empty).
void OnInherited(EngineSession& session, StampWriter& writer, const Flags& flags,
                 const SessionEvent& event) {
  uint32_t blocks = 0;
  for (const MappedExtent& e : event.extents) blocks += e.count;
  const std::string dir = flags.violations_dir + "/..";
  const std::vector<pid_t> running = testing::OthersStillRunning(dir, session.engine_id());
  std::ofstream(dir + "/inherited-" + std::to_string(session.engine_id()) + ".txt")
      << blocks << " blocks; workers of other engines still running: " << running.size() << "\n";
  for (pid_t pid : running) {
    writer.Report("invariant violation: granted " + std::to_string(blocks) +
                  " blocks of a fenced engine while its worker " + std::to_string(pid) +
                  " still runs");
  }
}

// --read-quarantine: the dead primary's quarantined device blocks, read through a read-only
// mapping before their barrier: how many carry a stamp of another engine (its last writes).
void ReadQuarantine(EngineSession& session, const testing::DeviceAccess& device, const Flags& flags,
                    const SessionEvent& promoted) {
  uint32_t blocks = 0;
  uint32_t foreign = 0;
  Status status = session.MapQuarantined().status();
  for (const MappedExtent& e : promoted.quarantined) {
    for (uint32_t b = e.first; status.ok() && b < e.first + e.count; ++b) {
      BlockStamp stamp{};
      status =
          device.Read(session.device_pool()->address + uint64_t{b} * session.pool().block_bytes,
                      &stamp, sizeof(stamp));
      ++blocks;
      foreign += stamp.magic == kStampMagic && stamp.engine_id != session.engine_id() ? 1 : 0;
    }
  }
  std::ofstream(flags.violations_dir + "/../quarantine-read-" +
                std::to_string(session.engine_id()) + ".txt")
      << (status.ok() ? "read " : "not read (" + status.ToString() + ") ") << blocks
      << " blocks; stamped by another engine: " << foreign << "\n";
}

// Handles controller events until a stop or a lost connection.
void ServeEvents(EngineSession& session, StampWriter& writer, const Flags& flags,
                 testing::EngineWorker* worker) {
  while (true) {
    std::optional<SessionEvent> event = session.NextEvent(std::chrono::milliseconds(100));
    if (!event.has_value()) continue;
    switch (event->kind) {
      case SessionEventKind::kReclaim: {
        std::this_thread::sleep_for(std::chrono::milliseconds(flags.reclaim_delay_ms));
        std::lock_guard<std::mutex> lock(writer.mu());
        const std::vector<MappedExtent> give = ReclaimWholeChunks(session, event->blocks);
        if (worker != nullptr) {
          std::vector<uint32_t> blocks;
          for (const MappedExtent& e : give) {
            for (uint32_t b = e.first; b < e.first + e.count; ++b) blocks.push_back(b);
          }
          worker->Withdraw(blocks);
        }
        (void)session.ReturnBlocks(give);
        break;
      }
      case SessionEventKind::kResume:
        BATON_LOG(INFO, "test-engine") << "drain called off: serving again";
        break;
      case SessionEventKind::kGranted:
        if (!event->inherited_headers.empty()) {
          OnInherited(session, writer, flags, *event);
          if (flags.read_quarantine) session.ReleaseQuarantined();  // the grant's stay mapped
        }
        break;
      case SessionEventKind::kDrain: {
        const auto until =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(flags.drain_ms);
        auto held = [&] {
          return std::chrono::steady_clock::now() < until ||
                 (!flags.drain_hold_file.empty() &&
                  ::access(flags.drain_hold_file.c_str(), F_OK) == 0);
        };
        while (held() && !session.resume_pending()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        (void)session.ReportDrained(session.resume_pending() ? 1 : 0);
        break;
      }
      case SessionEventKind::kStop:
      case SessionEventKind::kDisconnected:
        return;
      default:
        break;
    }
  }
}

// With device memory: the device copy of the weights holds the host arena's bytes.
bool CheckDeviceWeights(const EngineSession& s, const testing::DeviceAccess& access) {
  const std::optional<DeviceRegionView> device = s.device_weights();
  std::vector<uint8_t> copy(s.weights().size);
  Status read = device.has_value() && device->bytes >= copy.size()
                    ? access.Read(device->address, copy.data(), copy.size())
                    : NotFound("no device weights");
  if (!read.ok() || std::memcmp(copy.data(), s.weights().base, copy.size()) != 0) {
    BATON_LOG(ERROR, "test-engine")
        << "the device weights differ from the arena " << read.ToString();
    return false;
  }
  BATON_LOG(INFO, "test-engine") << "device weights equal the arena's " << s.weights().size
                                 << " bytes";
  return true;
}

// Stops the whole process as soon as the weight arena shows up in its mappings (the SDK maps
// it while registering, before it pre-faults and reports ready).
void HangOnceTheArenaIsMapped() {
  std::thread([] {
    while (true) {
      std::ifstream maps("/proc/self/maps");
      std::string line;
      while (std::getline(maps, line)) {
        if (line.find("memfd:baton-weights") != std::string::npos) {
          ::kill(::getpid(), SIGSTOP);
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }).detach();
}

int RunEngine(const Flags& flags, const EngineLaunchInfo& info) {
  if (info.engine_id == flags.hang_registering_id) HangOnceTheArenaIsMapped();
  EngineSessionOptions options;
  options.launch = info;
  options.engine_version = "test-engine/1";
  options.http_address = "127.0.0.1:" + std::to_string(info.http_port);
  options.use_device_memory = flags.device_memory;
  options.handles_resume = !flags.protocol_2;
  Result<std::unique_ptr<EngineSession>> session = EngineSession::Connect(options);
  if (!session.ok()) {
    BATON_LOG(ERROR, "test-engine") << session.status().ToString();
    return 1;
  }
  EngineSession& s = **session;
  std::optional<testing::DeviceAccess> device;
  if (flags.device_memory && s.device_pool().has_value()) {
    Result<testing::DeviceAccess> opened = testing::DeviceAccess::Open(s.device_pool()->device);
    if (!opened.ok() || !CheckDeviceWeights(s, *opened)) return 1;
    device = std::move(opened).value();
  }
  Result<SessionEvent> promoted = DeadlineExceeded("not yet");
  while (true) {
    promoted = s.WaitForPromotion(std::chrono::milliseconds(200));
    if (promoted.ok() || promoted.status().code() != StatusCode::kDeadlineExceeded) break;
  }
  if (!promoted.ok()) return 0;  // told to stop, or the controller went away
  if (flags.read_quarantine && device.has_value() && !promoted->quarantined.empty()) {
    ReadQuarantine(s, *device, flags, *promoted);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(flags.promote_delay_ms));
  while (!flags.promote_hold_file.empty() && ::access(flags.promote_hold_file.c_str(), F_OK) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!s.MarkServing().ok()) return 1;
  if (flags.exit_after_promote) return 0;
  StampWriter writer(&s, flags, device);
  std::atomic<bool> stop{false};
  std::thread compute([&] { writer.Run(stop); });
  std::unique_ptr<testing::EngineWorker> worker;
  if (flags.worker_mb >= 0 && !flags.violations_dir.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // its blocks filled first
    std::vector<std::pair<uint32_t, uint8_t*>> blocks;
    for (const MappedExtent& e : s.extents()) {
      for (uint32_t b = e.first; b < e.first + e.count; ++b) {
        blocks.emplace_back(b, s.pool().BlockData(b));
      }
    }
    worker = testing::EngineWorker::Start(flags.violations_dir + "/..", s.engine_id(), blocks,
                                          s.pool().block_bytes, flags.worker_mb);
    BATON_LOG(INFO, "test-engine") << "worker " << (worker ? worker->pid() : -1) << " writes into "
                                   << blocks.size() << " blocks";
  }
  ServeEvents(s, writer, flags, worker.get());
  worker.reset();
  stop = true;
  compute.join();
  s.Shutdown();
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  baton::Flags flags;
  if (!baton::ParseFlags(argc, argv, &flags)) return 2;
  baton::Result<baton::EngineLaunchInfo> info = baton::LaunchInfoFromEnv();
  if (!info.ok()) {
    std::fprintf(stderr, "test engine: %s\n", info.status().message().c_str());
    return 2;
  }
  if (flags.crash_if_id_above != 0 && info->engine_id > flags.crash_if_id_above) return 3;
  const std::string rogue = baton::ClaimRogueMode(flags.rogue_file);
  if (!rogue.empty()) return baton::testing::RunRogue(rogue, flags.violations_dir, *info);
  return baton::RunEngine(flags, *info);
}
