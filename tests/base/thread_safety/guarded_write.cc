// The same write as unguarded_write.cc with its lock held: the clang build accepts it, so the
// other test fails for the missing lock and nothing else (ctest
// thread_safety_accepts_a_guarded_write).
#include "base/mutex.h"

namespace {

class Counter {
 public:
  void Add() BATON_EXCLUDES(mu_) {
    baton::MutexLock lock(mu_);
    ++count_;
    AddLocked();
  }

 private:
  void AddLocked() BATON_REQUIRES(mu_) { ++count_; }

  baton::Mutex mu_;
  int count_ BATON_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Add();
}
