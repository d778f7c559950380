// batonctl status's text (controller/ctl/ctl_status_text.cc) on a status made by hand.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "controller/ctl/ctl_service.h"

namespace baton {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(StatusText, TheWeightsSayTheirLoadSpeedOrThatTheyWereAdopted) {
  ControllerConfig config;
  ControllerStatus s;
  s.config = &config;
  s.weights.load_gbps = 1.2398105845745673;
  s.weights.bytes_read = 4'194'304;
  EXPECT_TRUE(Has(StatusText(s), ", loaded at 1.24 GB/s\n")) << StatusText(s);
  s.weights.load_gbps = 0;
  s.weights.bytes_read = 0;  // a controller that adopted the arena from baton-keeper
  EXPECT_TRUE(Has(StatusText(s), ", adopted (no byte read)\n")) << StatusText(s);
}

// Between trips the guard line counts the failures in the window, against what trips it.
TEST(StatusText, TheCrashLoopGuardCountsTheFailuresInItsWindow) {
  ControllerConfig config;
  config.crash.max_failures = 5;
  config.crash.window = std::chrono::seconds(60);
  ControllerStatus s;
  s.config = &config;
  s.core.guard_recent_failures = 1;
  EXPECT_TRUE(Has(StatusText(s),
                  "\ncrash-loop guard: 1 failure in the last 60 s (it trips at 5), "
                  "level 0\n"))
      << StatusText(s);
  s.core.guard_recent_failures = 0;
  s.core.guard_level = 2;
  EXPECT_TRUE(Has(StatusText(s),
                  "\ncrash-loop guard: 0 failures in the last 60 s (it trips at 5), "
                  "level 2\n"))
      << StatusText(s);
}

// In backoff the line says what tripped the guard and when the next restart may start.
TEST(StatusText, TheCrashLoopGuardInBackoffSaysWhatTrippedItAndTheNextRestart) {
  ControllerConfig config;
  config.crash.max_failures = 5;
  config.crash.window = std::chrono::seconds(60);
  ControllerStatus s;
  s.config = &config;
  s.core.now = TimePoint(std::chrono::seconds(1000));
  s.core.guard_in_backoff = true;
  s.core.guard_level = 4;
  s.core.guard_recent_failures = 0;
  s.core.guard_next_restart_at = s.core.now + std::chrono::microseconds(7'812'346);
  EXPECT_TRUE(Has(StatusText(s),
                  "\ncrash-loop guard: in backoff, tripped by 5 failures in 60 s, "
                  "level 4; next restart in 7812.35 ms; 0 failures since\n"))
      << StatusText(s);
}

// A restarted controller says how long its pair took to be ready again, to 2 decimals.
TEST(StatusText, TheReadoptionTimeHasTwoDecimals) {
  ControllerConfig config;
  ControllerStatus s;
  s.config = &config;
  s.core.recovery.restarted = true;
  s.core.recovery.readopt_ms = 11.337612;
  EXPECT_TRUE(Has(StatusText(s), ", pair ready in 11.34 ms\n")) << StatusText(s);
}

// An engine that registered and has not said it is ready (one connected with
// ready_when_waiting that has not waited for its promotion yet) is shown registering, as in
// --json's state; one not registered yet is shown launching.
TEST(StatusText, AnEngineNotReadyYetShowsItsStateRegisteringOrLaunching) {
  ControllerConfig config;
  ControllerStatus s;
  s.config = &config;
  EngineStatus e;
  e.id = 33;
  e.pid = 30219;
  e.role = proto::EngineRole::kLaunching;
  e.state = EngineState::kRegistering;
  s.core.engines.push_back(e);
  EXPECT_TRUE(Has(StatusText(s), "  engine 33 registering pid 30219 ")) << StatusText(s);
  s.core.engines[0].state = EngineState::kLaunching;
  EXPECT_TRUE(Has(StatusText(s), "  engine 33 launching pid 30219 ")) << StatusText(s);
}

}  // namespace
}  // namespace baton
