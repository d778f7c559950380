// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with the
// thread-safety annotations of base/thread_annotations.h, so that Clang checks the lock rules
// that members and methods declare (BATON_GUARDED_BY(mu_), BATON_REQUIRES(mu_), ...).
//
//   Mutex mu_;
//   int count_ BATON_GUARDED_BY(mu_);
//   void Add() BATON_EXCLUDES(mu_) { MutexLock lock(mu_); ++count_; }
//
// Mutex is BasicLockable and Lockable (lock/unlock/try_lock), so std::scoped_lock over two
// of them works; the analysis, though, only follows Mutex's own methods and MutexLock.
// None of these is copyable or movable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/thread_annotations.h"

namespace baton {

// A non-recursive exclusive lock. Locking it twice on one thread deadlocks, as std::mutex.
class BATON_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() BATON_ACQUIRE() { mu_.lock(); }
  void unlock() BATON_RELEASE() { mu_.unlock(); }
  // True when the lock was taken; never blocks.
  bool try_lock() BATON_TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // Tells the analysis that the caller holds the lock, where it cannot see that for itself
  // (a callback invoked under the lock). Checks nothing at run time.
  void AssertHeld() const BATON_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope: locks in the constructor and unlocks in the destructor unless
// Unlock() let it go without a Lock() since. Unlock()/Lock() let a function drop the lock
// around slow work (I/O, a callback) and take it again; the analysis follows both.
class BATON_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) BATON_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() BATON_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Requires the lock held by this object.
  void Unlock() BATON_RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  // Requires the lock let go by Unlock().
  void Lock() BATON_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable waited on with a held Mutex. Each Wait* releases mu while it blocks
// and holds it again when it returns; wake-ups may be spurious, so wait in a loop that
// re-checks the condition under the lock:
//
//   MutexLock lock(mu_);
//   while (!ready_) cv_.Wait(mu_);
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex& mu) BATON_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // std::cv_status::timeout once `timeout` has passed without a notification.
  template <class Rep, class Period>
  std::cv_status WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout)
      BATON_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    std::cv_status status = cv_.wait_for(lock, timeout);
    lock.release();
    return status;
  }
  // std::cv_status::timeout once `deadline` has passed without a notification.
  template <class Clock, class Dur>
  std::cv_status WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Dur>& deadline)
      BATON_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    std::cv_status status = cv_.wait_until(lock, deadline);
    lock.release();
    return status;
  }

  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace baton
