// ComputePool: a small fixed set of worker threads that split a loop over [0, n) for the
// compute core (matmul rows, attention heads).
//
// ParallelFor cuts the range into at most `threads` contiguous pieces, runs the first on
// the calling thread and the rest on the workers, and returns when all are done. Which
// piece a thread gets never changes the result: every output element is computed by one
// thread with the same code, so results are bitwise independent of the thread count.
// One caller at a time (the engine's compute thread); the pool owns and joins its workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace baton {

class ComputePool {
 public:
  // fn(begin, end, worker): worker is in [0, threads()) and unique among concurrent calls.
  using RangeFn = std::function<void(int64_t, int64_t, int)>;

  explicit ComputePool(int threads);
  ~ComputePool();
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  int threads() const { return threads_; }
  // Runs fn over [0, n); ranges shorter than `min_chunk` are not split further.
  void ParallelFor(int64_t n, int64_t min_chunk, const RangeFn& fn);

 private:
  void WorkerLoop(int worker);

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const RangeFn* fn_ = nullptr;  // the job being run
  int64_t n_ = 0;
  int pieces_ = 0;
  uint64_t generation_ = 0;  // bumped for each job
  int pending_ = 0;          // worker pieces not yet finished
  bool stop_ = false;
};

}  // namespace baton
