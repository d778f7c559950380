// ComputePool: a small fixed set of worker threads that split a loop over [0, n) for the
// compute core (matmul rows, attention heads).
//
// ParallelFor cuts the range into contiguous chunks (a few per thread, none shorter than
// `min_chunk` unless the range is), which the calling thread and the workers claim one at a
// time until none is left; it returns when all are done. A worker that wakes late therefore
// delays nothing: the caller takes its chunks. Which thread runs a chunk never changes the
// result: every output element is computed by one thread with the same code, so results are
// bitwise independent of the thread count and of the timing.
//
// A forward pass calls ParallelFor a few hundred times with short serial work in between,
// so a worker that finished spins (with a pause instruction) for up to `kSpin` watching for
// the next job before it sleeps on a condition variable; the caller spins (then yields) for
// the chunks still running. Without the spin every call paid a futex wake-up of a sleeping
// worker and of the caller, which on a VM's idle vCPU costs tens of microseconds each.
//
// One caller at a time (the engine's compute thread); the pool owns and joins its workers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace baton {

class ComputePool {
 public:
  // fn(begin, end, worker): worker is in [0, threads()) and unique among concurrent calls;
  // one thread may run several chunks of a job, one after the other. An exception from fn
  // on the calling thread reaches the caller once the workers are out of the job; one on a
  // worker ends the process (std::terminate), as from any std::thread.
  using RangeFn = std::function<void(int64_t, int64_t, int)>;

  // How long an idle worker watches for the next job before it sleeps.
  static constexpr std::chrono::microseconds kSpin{1000};

  explicit ComputePool(int threads);
  ~ComputePool();
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  int threads() const { return threads_; }
  // Runs fn over [0, n); ranges shorter than `min_chunk` are not split further.
  void ParallelFor(int64_t n, int64_t min_chunk, const RangeFn& fn);

 private:
  void WorkerLoop(int worker);
  // Waits for an open job other than `seen`; false when the pool stops.
  bool WaitForJob(uint64_t seen);
  // Claims and runs chunks of the open job until none is left.
  void RunChunks(int worker);
  // Closes the open job and waits until no worker is inside it.
  void CloseJob(uint64_t open);

  const int threads_;
  std::vector<std::thread> workers_;

  // The job: written by the caller before `job_` opens it, read-only while it is open and
  // while a worker is `inside_` it.
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  // Odd while a job is open, even once the caller closed it; bumped for each job.
  std::atomic<uint64_t> job_{0};
  std::atomic<int> inside_{0};  // workers between entering a job and leaving it

  std::mutex mu_;  // guards the sleep of idle workers
  std::condition_variable work_cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace baton
