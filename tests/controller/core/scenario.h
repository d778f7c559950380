// Scenario: the fixture of the scenario tests (scenario_*_test.cc), each the story of one
// operation of the controller told as the effects it takes, in order.
//
// A scenario drives the production Coordinator through the simulation's loop (SimLoop,
// tests/controller/sim_loop.h) against its model of the world, with one fixed seed, on a
// FakeClock: the pair is started and brought to ready, something happens (the primary is
// killed, hangs, the operator promotes, ...), time passes with the engines heartbeating and
// the router sending traffic, and the test asserts the effects the Coordinator took through
// SimEffects (and the epochs it made durable) as a subsequence of its journal, in that order:
// "Kill(1)", "EpochDurable(2)", "SaveRoster", "Send(2, Promote)", "PublishRoutes",
// "Launch(3, standby)". The ground truth's own checks (fencing rules 1-5, SimWorld::Check)
// and the ledger's run after every slice of time.
//
// Header-only test support; single-threaded.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/controller/sim_loop.h"

namespace baton::sim {

class Scenario : public ::testing::Test {
 protected:
  static constexpr uint64_t kSeed = 1;

  Scenario() : loop_(kSeed, Fault{.blocks = 32, .reserve = -1}) {
    loop_.effects().SetJournal(&journal_);
    loop_.store().journal = &journal_;
  }
  ~Scenario() override {
    loop_.effects().SetJournal(nullptr);
    loop_.store().journal = nullptr;
  }

  // --- the set-up ---------------------------------------------------------------------------
  // The controller starts fresh and the pair becomes ready; the journal then starts empty.
  void StartReadyPair() {
    loop_.StartController(/*restart=*/false, /*memory_kept=*/false);
    WaitUntil([this] { return Ready(); }, std::chrono::seconds(5), "the pair to be ready");
    primary_ = coord().primary();
    standby_ = StandbyId();
    journal_.clear();
  }
  // The same on the CUDA backend, its device probed every 100 ms.
  void StartReadyPairOnTheGpu() {
    loop_.set_cuda_backend(true);
    loop_.config().gpu_probe_interval = std::chrono::milliseconds(100);
    StartReadyPair();
  }

  // --- what happens -------------------------------------------------------------------------
  // kill -9: the process dies; its socket reaches EOF and its pidfd fires.
  void PrimaryDies() { loop_.world().Crash(primary_); }
  void StandbyDies() { loop_.world().Crash(standby_); }
  // The primary freezes: no heartbeat, no answer to a health request.
  void PrimaryHangs() { loop_.world().Hang(primary_); }
  // The GPU fails (the next probe says so) and is usable again `down` later.
  void DeviceLost(Duration down) {
    loop_.world().device.lost = true;
    loop_.world().device.back_at = loop_.clock().Now() + down;
  }
  // The controller crashes and a new one starts from the roster, the journal and what runs.
  void ControllerRestarts() { loop_.RestartController(); }

  // Time passes: the engines that talk to the controller heartbeat every 50 ms, the router
  // sends each routed engine its share of the traffic, and the checks run on the world.
  void Wait(Duration d) {
    const TimePoint end = loop_.clock().Now() + d;
    while (loop_.clock().Now() < end) {
      const Duration slice = std::min<Duration>(kSlice, end - loop_.clock().Now());
      Heartbeats();
      loop_.world().router.Serve(loop_.effects().routes(), loop_.world().engines(), slice, rng_);
      loop_.RunFor(slice);
      Check();
    }
  }
  template <typename Pred>
  void WaitUntil(Pred done, Duration limit, const std::string& what) {
    const TimePoint end = loop_.clock().Now() + limit;
    while (!done() && loop_.clock().Now() < end) Wait(kSlice);
    ASSERT_TRUE(done()) << "waited " << ToMillis(limit) << " ms for " << what << "\n" << Story();
  }

  // --- what the test reads ------------------------------------------------------------------
  // `expected` are in the journal in this order (other effects may come between them).
  void ExpectEffects(const std::vector<std::string>& expected) {
    size_t at = 0;
    for (const std::string& want : expected) {
      while (at < journal_.size() && journal_[at] != want) ++at;
      if (at == journal_.size()) {
        ADD_FAILURE() << "expected, in order: " << Joined(expected) << "\nmissing from \"" << want
                      << "\" on\n"
                      << Story();
        return;
      }
      ++at;
    }
  }
  void ExpectNoEffect(const std::string& effect) {
    for (const std::string& e : journal_) {
      EXPECT_NE(e, effect) << Story();
    }
  }
  // How many times `effect` is in the journal.
  size_t Count(const std::string& effect) const {
    return static_cast<size_t>(std::count(journal_.begin(), journal_.end(), effect));
  }
  // How many times `part` is in `text` (a captured log's lines, say).
  static size_t Occurrences(const std::string& text, const std::string& part) {
    size_t n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
  }
  std::string Story() const {
    std::string s = "the effects taken:\n";
    for (const std::string& e : journal_) s += "  " + e + "\n";
    return s;
  }

  Coordinator& coord() { return loop_.coordinator(); }
  bool Ready() {
    return coord().pair_state() == PairState::kReady && !coord().recovering() &&
           coord().ledger().Snapshot().quarantined_blocks == 0;
  }
  // The live standby's id (kNoEngine if none).
  EngineId StandbyId() {
    for (const auto& [id, e] : loop_.world().engines()) {
      const EngineRecord* r = coord().engine(id);
      if (r != nullptr && r->live() && r->is(EngineState::kStandby)) return id;
    }
    return kNoEngine;
  }
  static std::string E(const char* what, EngineId id) {
    return std::string(what) + "(" + std::to_string(id) + ")";
  }
  static std::string Send(EngineId id, const char* message) {
    return "Send(" + std::to_string(id) + ", " + message + ")";
  }
  static std::string Launch(EngineId id, const char* role) {
    return "Launch(" + std::to_string(id) + ", " + role + ")";
  }
  std::string EpochDurable(uint64_t epoch) { return E("EpochDurable", epoch); }

  static constexpr Duration kSlice = std::chrono::milliseconds(10);

  SimLoop loop_;
  std::vector<std::string> journal_;
  Rng rng_{kSeed};
  EngineId primary_ = kNoEngine;
  EngineId standby_ = kNoEngine;

 private:
  static int64_t ToMillis(Duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  }
  static std::string Joined(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : " -> ") + x;
    return s;
  }
  void Heartbeats() {
    const TimePoint now = loop_.clock().Now();
    if (now < next_heartbeat_) return;
    next_heartbeat_ = now + std::chrono::milliseconds(50);
    for (auto& [id, e] : loop_.world().engines()) {
      if (!e.Working() || !e.attached) continue;
      loop_.world().Send(e, proto::Heartbeat{.epoch = e.epoch, .seq = ++e.heartbeat_seq},
                         std::chrono::milliseconds(1));
    }
  }
  void Check() {
    if (Status st = loop_.world().Check(); !st.ok())
      ADD_FAILURE() << st.message() << "\n" << Story();
    if (Status st = coord().ledger().CheckInvariants(); !st.ok()) ADD_FAILURE() << st.message();
    EXPECT_TRUE(coord().invariants().ok()) << coord().invariants().message();
    EXPECT_EQ(coord().refused_transitions(), 0u);
  }
  TimePoint next_heartbeat_{};
};

}  // namespace baton::sim
