// What the two source files of libbaton_engine.so share (baton_engine_c.cc, the session's
// calls; baton_engine_kv_c.cc, the KV-warm handoff's): the handle, the error convention and
// the event conversion. Not installed, not part of the ABI.
//
// The handle owns the session, and keeps what the C event has no room for: the block headers
// the latest PROMOTED or GRANTED event came with and, from the PROMOTED event, the
// predecessor's quarantined blocks. Those are guarded by `kv_mu` (any thread may ask).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "standby/sdk/baton_engine.h"
#include "standby/sdk/engine_sdk.h"

struct baton_engine {
  std::unique_ptr<baton::EngineSession> session;
  bool controller_events = false;           // BATON_ENGINE_CONTROLLER_EVENTS
  std::atomic<bool> drain_successor{true};  // the latest DRAIN event's SessionEvent::successor

  std::mutex kv_mu;
  std::vector<uint8_t> headers;                  // the latest PROMOTED / GRANTED event's
  std::vector<baton::MappedExtent> quarantined;  // the PROMOTED event's
  std::vector<uint8_t> quarantined_headers;
  int64_t barrier_estimate_us = 0;
  int64_t wait_limit_ms = 0;
};

namespace baton_c {

// Longer than this waits forever: a larger count of milliseconds would overflow the clock's
// nanoseconds and return at once.
inline constexpr int64_t kForeverMs = int64_t{365} * 24 * 3600 * 1000;

// Sets this thread's last error; returns the status's code (kInternal for an OK one).
int Fail(const baton::Status& status);
// 0 and no error for OK, else Fail(status).
int Done(const baton::Status& status);
int BadArgument(const char* what);
std::chrono::milliseconds Millis(int64_t ms);
// nullopt (forever) for a negative timeout or one over kForeverMs.
std::optional<baton::Duration> Timeout(int64_t ms);
void FillEvent(const baton::SessionEvent& e, baton_event* out);
// Keeps what `event` brings beyond the C event (headers, quarantined blocks, whether a
// drain has a successor).
void Remember(baton_engine* engine, const baton::SessionEvent& event);

// Runs one entry point's body. An exception (std::bad_alloc, a std::system_error from a
// thread or a socket that could not be made) becomes error code kInternal with its text:
// the caller may be C, ctypes or cgo, where an unwinding C++ exception ends the process.
template <typename F>
auto Guarded(const char* function, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    return static_cast<decltype(body())>(
        Fail(baton::Internal(std::string(function) + ": " + e.what())));
  } catch (...) {
    return static_cast<decltype(body())>(
        Fail(baton::Internal(std::string(function) + ": unknown exception")));
  }
}

}  // namespace baton_c
