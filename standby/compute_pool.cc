#include "standby/compute_pool.h"

#include <algorithm>

namespace baton {
namespace {

// Bounds of piece `i` of `pieces` over [0, n).
int64_t PieceBegin(int64_t n, int pieces, int i) { return n * i / pieces; }

}  // namespace

ComputePool::ComputePool(int threads) : threads_(std::clamp(threads, 1, 256)) {
  workers_.reserve(threads_ - 1);
  for (int w = 1; w < threads_; ++w) workers_.emplace_back([this, w] { WorkerLoop(w); });
}

ComputePool::~ComputePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ComputePool::ParallelFor(int64_t n, int64_t min_chunk, const RangeFn& fn) {
  if (n <= 0) return;
  const int64_t by_size = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int pieces = static_cast<int>(std::min<int64_t>(threads_, by_size));
  if (pieces == 1) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    pieces_ = pieces;
    pending_ = pieces - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  fn(0, PieceBegin(n, pieces, 1), 0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ComputePool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (worker >= pieces_) continue;
    const RangeFn* fn = fn_;
    const int64_t begin = PieceBegin(n_, pieces_, worker);
    const int64_t end = PieceBegin(n_, pieces_, worker + 1);
    lock.unlock();
    (*fn)(begin, end, worker);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace baton
