// The simulation's random events (sim_driver.h): time passing with heartbeats and the
// routers' traffic, lease requests, returns, crashes, hangs, error reports, drills, stale
// replays, forged epochs, returns of unheld blocks and a standby asking for blocks. Part of
// sim_driver.h, which includes it at its end; include that header, not this one.
// Header-only test support; single-threaded.
#pragma once

#include <iterator>
#include <set>
#include <string>

namespace baton::sim {

inline void Simulation::RandomEvent() {
  const uint64_t r = rng_.Range(0, 104);
  if (r < 30) return AdvanceTime(rng_.Millis(1, 100), /*slow=*/true);
  if (r < 44) return RequestGrant();
  if (r < 56) return ReturnBlocks();
  if (r < 60) return CrashPrimary();
  if (r < 63) return Crash(PickStandby(), "standby");
  if (r < 65) return Crash(Pick([](const SimEngine& e) { return e.alive; }), "any");
  if (r < 68) return Hang();
  if (r < 70) return ReportError();
  if (r < 72) return CrashController();
  if (r < 78) return ReplayStale();
  if (r < 83) return Forge();
  if (r < 87) return ReturnUnheld();
  if (r < 91) return StandbyAsksForBlocks();
  if (r < 93) return GracefulPromote();
  if (r < 95) return Upgrade();
  if (r < 96) return Rollback();
  if (r < 97) return DrainOrResume();
  if (r < 98) return LoseDevice();
  if (r < 99 && rng_.Chance(25)) return StopAndStartAgain();
  return AdvanceTime(rng_.Millis(100, 400), /*slow=*/true);
}

// Time passes; then every engine that talks to the controller sends a heartbeat (a slow
// one sometimes misses it).
inline void Simulation::AdvanceTime(Duration d, bool slow) {
  world_.Generate();
  world_.router.Serve(effects_.routes(), world_.engines(), d, rng_);
  RunFor(d);
  if (verbose_) Note("time +" + std::to_string(d.count() / 1000000) + "ms");
  for (auto& [id, e] : world_.engines()) {
    if (!Talking(e) || (slow && rng_.Chance(10))) continue;
    world_.Send(e, proto::Heartbeat{.epoch = e.epoch, .seq = ++e.heartbeat_seq}, rng_.Millis(0, 2));
  }
  RunFor(Duration::zero());
}
inline void Simulation::RequestGrant() {
  const EngineId id = PickPrimary();
  if (id == kNoEngine) return;
  SimEngine& e = *world_.Find(id);
  const proto::LeaseRequest m{.epoch = e.epoch, .blocks = static_cast<uint32_t>(rng_.Range(1, 8))};
  world_.Note(e, m);
  (void)Deliver(id, m, false, "asks:");
}
inline void Simulation::ReturnBlocks() {
  const EngineId id = PickPrimary();
  if (id == kNoEngine) return;
  SimEngine& e = *world_.Find(id);
  if (e.mapped.empty()) return;
  auto it = e.mapped.begin();
  std::advance(it, rng_.Range(0, e.mapped.size() - 1));
  std::set<uint32_t> give{*it};
  const uint32_t want = static_cast<uint32_t>(rng_.Range(1, 6));
  while (give.size() < want && e.mapped.count(*give.rbegin() + 1)) give.insert(*give.rbegin() + 1);
  e.kv->Give(give);
  for (uint32_t b : give) e.mapped.erase(b);  // unmapped before it says so
  const proto::ReturnExtents m{.epoch = e.epoch, .extents = Runs(give)};
  world_.Note(e, m);
  given_up_.insert(give.begin(), give.end());
  if (!Deliver(id, m, false, "returns:")) {
    world_.Flag("model: engine " + std::to_string(id) + "'s valid return was refused");
  }
}
inline void Simulation::CrashPrimary() {
  if (rng_.Chance(20) && coord_->Drill(DrillKind::kKill).ok()) return Note("drill kill");
  Crash(PickPrimary(), "primary");
}
inline void Simulation::Crash(EngineId id, const char* role) {
  if (id == kNoEngine) return;
  world_.Crash(id);
  Note(Id(id) + " (" + role + ") crashes");
}
inline void Simulation::Hang() {
  if (rng_.Chance(10) && coord_->Drill(DrillKind::kHang).ok()) return Note("drill hang");
  const EngineId id = Pick([](const SimEngine& e) { return e.Working(); });
  if (id == kNoEngine) return;
  world_.Hang(id);
  Note(Id(id) + " hangs");
}
inline void Simulation::ReportError() {
  if (rng_.Chance(20) && coord_->Drill(DrillKind::kError).ok()) return Note("drill error");
  const EngineId id = PickPrimary();
  if (id == kNoEngine) return;
  SimEngine& e = *world_.Find(id);
  const proto::ErrorReport m{.epoch = e.epoch, .code = 13, .message = "device error"};
  world_.Note(e, m);
  (void)Deliver(id, m, false, "reports");
}
// Whether `m` returns a block that `e` maps now: a return it cannot have sent since.
inline bool ReturnsMapped(const SimEngine& e, const FromEngine& m) {
  const auto* r = std::get_if<proto::ReturnExtents>(&m);
  if (r == nullptr) return false;
  for (const proto::BlockRange& x : r->extents) {
    for (uint32_t b = x.first; b < x.first + x.count; ++b) {
      if (e.mapped.count(b) != 0) return true;
    }
  }
  return false;
}
// An old message again: from an engine that is gone, or one sent as a standby by an
// engine that now serves.
inline void Simulation::ReplayStale() {
  if (rng_.Chance(50)) {
    const EngineId id = Pick([](const SimEngine& e) { return !e.Working() && e.last_sent; });
    if (id == kNoEngine) return;
    const FromEngine m = *world_.Find(id)->last_sent;
    const bool stale = IsStale(id, EpochOf(m));
    // A hung engine still lives and maps its blocks but sends nothing: a message of its epoch
    // again would be one it never sent again (a return of blocks granted back to it since,
    // say). Only a stale one is replayed from it; a dead one's may be either, but for a
    // return of blocks it maps now (granted back to it since): it unmaps before it returns.
    const SimEngine& e = *world_.Find(id);
    if (!stale && (e.alive || ReturnsMapped(e, m))) return;
    out_.stats.refused_stale += !Deliver(id, m, stale, "replays");
    return;
  }
  const EngineId id = Pick([this](const SimEngine& e) {
    const EngineRecord* r = coord_->engine(e.id);
    return Talking(e) && e.promoted && e.standby_sent && r != nullptr &&
           (r->is(EngineState::kPrimary) || r->is(EngineState::kDraining));
  });
  if (id == kNoEngine) return;
  const FromEngine m = *world_.Find(id)->standby_sent;
  out_.stats.refused_stale += !Deliver(id, m, IsStale(id, EpochOf(m)), "replays");
}
inline void Simulation::Forge() {
  const EngineId id = PickPrimary();
  if (id == kNoEngine) return;
  const uint64_t epoch = world_.Find(id)->epoch;
  const uint64_t forged = rng_.Chance(50) || epoch == 1 ? epoch + 1 : epoch - 1;
  FromEngine m = proto::LeaseRequest{.epoch = forged, .blocks = 1};
  if (rng_.Chance(50)) m = proto::ReturnExtents{.epoch = forged, .extents = {{0, 1}}};
  out_.stats.refused_forged += !Deliver(id, m, true, "forges");
}
inline void Simulation::ReturnUnheld() {
  const EngineId id = rng_.Chance(70) ? PickPrimary() : PickStandby();
  if (id == kNoEngine) return;
  SimEngine& e = *world_.Find(id);
  proto::BlockRange x{static_cast<uint32_t>(rng_.Range(0, fault_.blocks - 1)), 1};
  const bool returning = clock_.Now() < e.returning_until && e.returning.count(x.first) != 0;
  if (e.mapped.count(x.first) || returning) {
    x = proto::BlockRange{fault_.blocks - 1, 3};  // past the end
  }
  const bool accepted = Deliver(id, proto::ReturnExtents{.epoch = e.epoch, .extents = {x}}, false,
                                "returns unheld blocks:");
  out_.stats.refused_forged += !accepted;
  if (accepted) {
    world_.Flag("refusal: engine " + std::to_string(id) + " returned blocks " +
                ToString(Extent{x.first, x.count}) + " it does not map and it was accepted");
  }
}
inline void Simulation::StandbyAsksForBlocks() {
  const EngineId id = PickStandby();
  if (id == kNoEngine) return;
  (void)Deliver(id, proto::LeaseRequest{.epoch = 0, .blocks = 2}, false, "(standby) asks for");
}

}  // namespace baton::sim
