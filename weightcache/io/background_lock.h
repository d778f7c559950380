// BackgroundLock: mlock(2) of one mapped range, done by a thread of its own, so that whoever
// maps the range (a controller adopting a kept weight arena) does not wait for the page walk
// that mlock makes: 2 GiB of 4 KiB pages is half a million page-table entries.
//
// The thread starts in the constructor, runs at SCHED_IDLE (only when no other thread wants a
// CPU) and locks the range in pieces of kPiece bytes, in order. When every piece is locked,
// locked() turns true; when one fails, what was locked is unlocked again and error() holds mlock's
// errno. The range must stay mapped until the object is destroyed: the destructor asks the thread
// to stop after the piece in progress and joins it (at most one piece of waiting). The lock itself
// ends with the mapping (munmap), not with this object. Not movable (the thread refers to it); its
// owner holds it by unique_ptr. locked(), done(), error() and Wait() may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stop_token>
#include <thread>

#include "base/mutex.h"

namespace baton {

class BackgroundLock {
 public:
  static constexpr size_t kPiece = size_t{64} << 20;

  BackgroundLock(const uint8_t* data, size_t size);
  ~BackgroundLock();
  BackgroundLock(const BackgroundLock&) = delete;
  BackgroundLock& operator=(const BackgroundLock&) = delete;

  // True once the whole range is locked.
  bool locked() const;
  // True once the thread has finished, locked or not.
  bool done() const;
  // mlock's errno when it failed; 0 otherwise.
  int error() const;
  // Seconds the thread took, once done (0 before).
  double seconds() const;
  // Blocks until done().
  void Wait() const;

 private:
  void Run(const std::stop_token& stop);

  const uint8_t* const data_;
  const size_t size_;
  mutable Mutex mu_;
  mutable CondVar finished_;
  bool done_ BATON_GUARDED_BY(mu_) = false;
  bool locked_ BATON_GUARDED_BY(mu_) = false;
  int error_ BATON_GUARDED_BY(mu_) = 0;
  double seconds_ BATON_GUARDED_BY(mu_) = 0;
  std::jthread thread_;  // last: starts once the members above exist
};

}  // namespace baton
