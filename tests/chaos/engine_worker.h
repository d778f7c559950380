// What the chaos tests' engine (test_engine_helper_main.cc) does to stand in for a
// multi-process engine and to see a foreign byte in its blocks (the promotion drill,
// quarantine_drill_test.cc):
//
//  * BlockFill: every block the engine holds is filled whole with 64-bit words tagged with the
//    engine's id (in the high 32 bits), the first time the engine sees it (its header
//    scrubbed); afterwards every word of it must carry that tag. A write by any other engine
//    (a stale write of a fenced one) is a foreign word: the block, the offset and the tag.
//  * EngineWorker: a worker process forked by the engine after its promotion, as a
//    multi-process engine's workers are: it maps the engine's blocks (the mapping is
//    inherited), writes tagged words into the second half of every block without pause, the
//    time of its last write (CLOCK_MONOTONIC ns) in DIR/worker-<id>.last and its pid in
//    DIR/worker-<id>.pid once it writes (Start waits for its first round), and between rounds
//    touches memory, 16 MiB a round, until it holds `resident_mb` MiB (so that its exit, once
//    killed, takes a while: ResidentMb says how far it got). Blocks the engine gives back it
//    lets go of first (Withdraw: at most a round's wait).
//    It never exits on its own: the fence kills it with its group and cgroup, and the engine
//    kills and reaps it when it stops normally.
//  * OthersStillRunning: the workers of other engines (by their pid files) that are alive and
//    not zombies: when the engine is granted blocks a fenced engine held, none may be left.
//
// Header-only test support; the worker's loop runs in a forked child and calls only what is
// safe after fork in a threaded process (memory writes, clock_gettime, _exit).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/process/proc_table.h"

namespace baton::testing {

inline uint64_t Tagged(uint64_t engine_id, uint64_t low) {
  return (engine_id << 32) | (low & 0xffffffffu);
}

// A foreign word found in a block: where, and whose tag.
struct ForeignWord {
  uint32_t block = 0;
  uint64_t offset = 0;
  uint64_t word = 0;
};

class BlockFill {
 public:
  BlockFill(uint64_t engine_id, uint64_t block_bytes, uint64_t header_bytes)
      : id_(engine_id), bytes_(block_bytes), header_(header_bytes) {}

  // Fills block `b` at `data` whole (past its header) with this engine's words.
  void Fill(uint32_t b, uint8_t* data) const {
    auto* words = reinterpret_cast<volatile uint64_t*>(data + header_);
    const uint64_t n = (bytes_ - header_) / sizeof(uint64_t);
    for (uint64_t i = 0; i < n; ++i) words[i] = Tagged(id_, b);
  }
  // The first word of block `b` not tagged with this engine's id, if any.
  std::optional<ForeignWord> Check(uint32_t b, const uint8_t* data) const {
    const auto* words = reinterpret_cast<const volatile uint64_t*>(data + header_);
    const uint64_t n = (bytes_ - header_) / sizeof(uint64_t);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t w = words[i];
      if ((w >> 32) != id_) return ForeignWord{b, header_ + i * sizeof(uint64_t), w};
    }
    return std::nullopt;
  }

 private:
  uint64_t id_;
  uint64_t bytes_;
  uint64_t header_;
};

class EngineWorker {
 public:
  static constexpr uint32_t kMaxBlocks = 4096;

  // Forks the worker over `blocks` (block number and data, `block_bytes` each); nullptr when
  // it could not.
  static std::unique_ptr<EngineWorker> Start(
      const std::string& dir, uint64_t engine_id,
      const std::vector<std::pair<uint32_t, uint8_t*>>& blocks, uint64_t block_bytes,
      int resident_mb) {
    const std::string base = dir + "/worker-" + std::to_string(engine_id);
    const int last_fd = ::open((base + ".last").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (last_fd < 0 || ::ftruncate(last_fd, sizeof(uint64_t)) != 0) return nullptr;
    void* last = ::mmap(nullptr, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, last_fd, 0);
    ::close(last_fd);
    void* shared =
        ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (last == MAP_FAILED || shared == MAP_FAILED) return nullptr;
    auto* state = new (shared) Shared();
    for (const auto& [b, data] : blocks) {
      if (b < kMaxBlocks) state->active[b].store(1);
    }
    const pid_t pid = ::fork();
    if (pid == 0) Loop(engine_id, blocks, block_bytes, resident_mb, state, last);
    ::munmap(last, sizeof(uint64_t));
    if (pid < 0) return nullptr;
    auto worker = std::unique_ptr<EngineWorker>(new EngineWorker(pid, state));
    // Its first round written: from the pid file on, it writes.
    for (int i = 0; i < 10000 && state->seen.load() == 0; ++i) ::usleep(1000);
    if (state->seen.load() == 0) return nullptr;
    std::ofstream(base + ".pid") << pid << "\n";
    return worker;
  }

  // Kills and reaps the worker.
  ~EngineWorker() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    ::munmap(state_, sizeof(Shared));
  }
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  // The engine gives `blocks` back: the worker stops writing them before this returns (as a
  // multi-process engine's workers let go of blocks before the engine returns them).
  void Withdraw(const std::vector<uint32_t>& blocks) {
    for (uint32_t b : blocks) {
      if (b < kMaxBlocks) state_->active[b].store(0);
    }
    const uint64_t gen = state_->gen.fetch_add(1) + 1;
    for (int i = 0; i < 100000 && state_->seen.load() < gen; ++i) ::usleep(10);
  }

  pid_t pid() const { return pid_; }

  // The time of the last write of engine `engine_id`'s worker (CLOCK_MONOTONIC ns; 0 if none).
  static uint64_t LastWrite(const std::string& dir, uint64_t engine_id) {
    std::ifstream in(dir + "/worker-" + std::to_string(engine_id) + ".last", std::ios::binary);
    uint64_t ns = 0;
    in.read(reinterpret_cast<char*>(&ns), sizeof(ns));
    return ns;
  }

 private:
  struct Shared {
    std::atomic<uint64_t> gen{1};   // bumped by Withdraw
    std::atomic<uint64_t> seen{0};  // the last gen the worker's loop started from; 0: not yet
    std::atomic<uint8_t> active[kMaxBlocks] = {};
  };

  EngineWorker(pid_t pid, Shared* state) : pid_(pid), state_(state) {}

  [[noreturn]] static void Loop(uint64_t engine_id,
                                const std::vector<std::pair<uint32_t, uint8_t*>>& blocks,
                                uint64_t block_bytes, int resident_mb, Shared* state, void* last) {
    ::close_range(3, ~0u, 0);  // the controller's socket among them: the engine's, not this one's
    const size_t resident = static_cast<size_t>(resident_mb) << 20;
    void* held = resident > 0 ? ::mmap(nullptr, resident, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                              : MAP_FAILED;
    size_t touched = held != MAP_FAILED ? 0 : resident;
    auto* last_write = static_cast<volatile uint64_t*>(last);
    const uint64_t half = block_bytes / 2 / sizeof(uint64_t);
    for (uint64_t counter = 1;; ++counter) {
      const uint64_t gen = state->gen.load();
      for (const auto& [b, data] : blocks) {
        if (b >= kMaxBlocks || state->active[b].load() == 0) continue;
        auto* words = reinterpret_cast<volatile uint64_t*>(data) + half;
        for (uint64_t i = 0; i < half; i += 64) words[i] = Tagged(engine_id, counter);
      }
      timespec now{};
      ::clock_gettime(CLOCK_MONOTONIC, &now);
      *last_write =
          static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec);
      state->seen.store(gen);  // a round begun after a Withdraw is done with it
      if (touched < resident) {
        const size_t n = std::min(resident - touched, size_t{16} << 20);
        std::memset(static_cast<uint8_t*>(held) + touched, 1, n);
        touched += n;
      }
    }
  }

  pid_t pid_;
  Shared* state_;
};

// The resident memory of `pid` in MiB (VmRSS; 0 if gone).
inline uint64_t ResidentMb(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) / 1024;
  }
  return 0;
}

// The pid of engine `id`'s worker in `dir` once it writes into the engine's blocks (its pid
// file), waited for up to twenty seconds; 0 if it never does.
inline pid_t WorkerPid(const std::string& dir, uint64_t id) {
  const std::string file = dir + "/worker-" + std::to_string(id) + ".pid";
  pid_t worker = 0;
  for (int i = 0; i < 2000 && worker == 0; ++i) {
    std::ifstream(file) >> worker;
    if (worker == 0) ::usleep(10'000);
  }
  return worker;
}

// Workers of engines other than `self` (DIR/worker-<id>.pid) still alive and not zombies.
inline std::vector<pid_t> OthersStillRunning(const std::string& dir, uint64_t self) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("worker-", 0) != 0 || entry.path().extension() != ".pid") continue;
    if (name == "worker-" + std::to_string(self) + ".pid") continue;
    pid_t pid = 0;
    std::ifstream(entry.path()) >> pid;
    if (ProcessRunning(pid)) out.push_back(pid);
  }
  return out;
}

}  // namespace baton::testing
