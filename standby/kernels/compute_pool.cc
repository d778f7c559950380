#include "standby/kernels/compute_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BATON_CPU_PAUSE() _mm_pause()
#else
#define BATON_CPU_PAUSE() std::this_thread::yield()
#endif

namespace baton {
namespace {

// Chunks a job is cut into per thread: enough that a late thread's share is small.
constexpr int64_t kChunksPerThread = 4;
// Pause instructions between clock reads while spinning, and before a waiting caller yields.
constexpr int kPausesPerCheck = 64;

bool Open(uint64_t job) { return (job & 1) != 0; }

}  // namespace

ComputePool::ComputePool(int threads) : threads_(std::clamp(threads, 1, 256)) {
  workers_.reserve(threads_ - 1);
  for (int w = 1; w < threads_; ++w) workers_.emplace_back([this, w] { WorkerLoop(w); });
}

ComputePool::~ComputePool() {
  stop_.store(true);
  { std::lock_guard<std::mutex> lock(mu_); }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ComputePool::ParallelFor(int64_t n, int64_t min_chunk, const RangeFn& fn) {
  if (n <= 0) return;
  const int64_t by_size = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int64_t chunks =
      std::min<int64_t>(by_size, threads_ == 1 ? 1 : threads_ * kChunksPerThread);
  if (chunks == 1) {
    fn(0, n, 0);
    return;
  }
  fn_ = &fn;
  n_ = n;
  chunks_ = chunks;
  next_chunk_.store(0, std::memory_order_relaxed);
  const uint64_t open = job_.load(std::memory_order_relaxed) + 1;
  job_.store(open);  // seq_cst: ordered before the sleepers_ check (see WaitForJob)
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lock(mu_); }
    work_cv_.notify_all();
  }
  try {
    RunChunks(0);
  } catch (...) {
    next_chunk_.store(chunks_);  // nothing more is claimed
    CloseJob(open);
    throw;
  }
  CloseJob(open);
}

// Every chunk is claimed. Close the job, then wait for the workers still inside it: a worker
// enters before it checks that the job is open (both seq_cst), so one that has not entered by
// now will see it closed and touch nothing.
void ComputePool::CloseJob(uint64_t open) {
  job_.store(open + 1);
  for (int spins = 0; inside_.load() != 0; ++spins) {
    if (spins < kPausesPerCheck) {
      BATON_CPU_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

void ComputePool::RunChunks(int worker) {
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= chunks_) return;
    (*fn_)(n_ * c / chunks_, n_ * (c + 1) / chunks_, worker);
  }
}

bool ComputePool::WaitForJob(uint64_t seen) {
  auto ready = [&] {
    const uint64_t job = job_.load();
    return Open(job) && job != seen;
  };
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  while (!stop_.load(std::memory_order_relaxed)) {
    for (int i = 0; i < kPausesPerCheck; ++i) {
      if (ready()) return true;
      BATON_CPU_PAUSE();
    }
    if (std::chrono::steady_clock::now() >= spin_until) break;
  }
  std::unique_lock<std::mutex> lock(mu_);
  // seq_cst: either ParallelFor's sleepers_ load sees this sleeper and notifies under the
  // mutex, or its job_ store comes first and the predicate below sees it.
  sleepers_.fetch_add(1);
  work_cv_.wait(lock, [&] { return stop_.load() || ready(); });
  sleepers_.fetch_sub(1);
  return !stop_.load();
}

void ComputePool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  while (WaitForJob(seen)) {
    const uint64_t job = job_.load();
    inside_.fetch_add(1);
    if (job_.load() == job && Open(job)) RunChunks(worker);
    inside_.fetch_sub(1);
    seen = job;
  }
}

}  // namespace baton
