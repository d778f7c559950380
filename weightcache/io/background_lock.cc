#include "weightcache/io/background_lock.h"

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>

#include "base/clock.h"

namespace baton {

BackgroundLock::BackgroundLock(const uint8_t* data, size_t size)
    : data_(data), size_(size), thread_([this](std::stop_token stop) { Run(stop); }) {}

BackgroundLock::~BackgroundLock() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void BackgroundLock::Run(const std::stop_token& stop) {
  // The page walk of a large arena of 4 KiB pages takes a CPU for hundreds of milliseconds:
  // it runs only when nothing else wants the CPU (a restarted controller re-adopting its
  // engines, the engines themselves), never in their way.
  sched_param idle{};
  (void)::sched_setscheduler(0, SCHED_IDLE, &idle);
  const TimePoint start = RealClock::Get().Now();
  size_t at = 0;
  int err = 0;
  while (at < size_ && !stop.stop_requested()) {
    const size_t n = std::min(kPiece, size_ - at);
    if (::mlock(data_ + at, n) != 0) {
      err = errno;
      break;
    }
    at += n;
  }
  // All or nothing: a range locked in part is reported, and left, as not locked.
  if (at < size_ && at > 0) ::munlock(data_, at);
  MutexLock hold(mu_);
  done_ = true;
  locked_ = at == size_;
  error_ = err;
  seconds_ = MillisBetween(start, RealClock::Get().Now()) / 1000.0;
  finished_.NotifyAll();
}

bool BackgroundLock::locked() const {
  MutexLock hold(mu_);
  return locked_;
}

bool BackgroundLock::done() const {
  MutexLock hold(mu_);
  return done_;
}

int BackgroundLock::error() const {
  MutexLock hold(mu_);
  return error_;
}

double BackgroundLock::seconds() const {
  MutexLock hold(mu_);
  return seconds_;
}

void BackgroundLock::Wait() const {
  MutexLock hold(mu_);
  while (!done_) finished_.Wait(mu_);
}

}  // namespace baton
