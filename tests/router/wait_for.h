// WaitFor: polls a condition in router tests that watch other threads (the subscriber's,
// the router's io threads). Header-only test support; any thread.
#pragma once

#include <chrono>
#include <thread>

namespace baton {

// Polls every 10 ms, up to 20 s, until `done` is true; returns its last value.
template <typename F>
bool WaitFor(F done) {
  for (int i = 0; i < 2000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace baton
