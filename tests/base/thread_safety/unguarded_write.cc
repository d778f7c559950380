// A write to a BATON_GUARDED_BY member without its lock: the clang build must refuse it
// (ctest thread_safety_refuses_an_unguarded_write). Compiled only by that test, never linked.
#include "base/mutex.h"

namespace {

class Counter {
 public:
  void Add() { ++count_; }  // mu_ not held

 private:
  baton::Mutex mu_;
  int count_ BATON_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Add();
}
