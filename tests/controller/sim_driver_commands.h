// The simulation's operator commands and the controller's own life (sim_driver.h): batonctl
// promote, upgrade (to a good or a broken version, "--bad": sim_services.h), rollback, drain,
// resume and stop; a device lost on the seeds that run the CUDA backend; the controller
// crashing, or stopped and started again. Part of sim_driver.h, which includes it at its end;
// include that header, not this one. Header-only test support; single-threaded.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace baton::sim {

inline void Simulation::GracefulPromote() {
  const Status status = coord_->RequestSwitchover();
  out_.stats.switchovers += status.ok();
  Note("batonctl promote: " + status.ToString());
}

inline void Simulation::Upgrade() {
  if (rng_.Chance(5)) return UpgradeToAMissingProgram();
  std::vector<std::string> command = {"sim-engine", "--version=" + std::to_string(++versions_)};
  if (rng_.Chance(30)) command.push_back("--bad");
  const Status status = coord_->RequestUpgrade(UpgradeRequest{.command = command});
  out_.stats.upgrades += status.ok();
  Note("batonctl upgrade -- " + Joined(command) + ": " + status.ToString());
}

// An upgrade to a program that is not there (SimEffects::CheckCommand) is refused, and
// nothing moves: no upgrade, the same standby, the same pair state.
inline void Simulation::UpgradeToAMissingProgram() {
  // The engines as (id, state): a refusal must leave every one as it was.
  auto engines = [this] {
    std::vector<std::pair<EngineId, EngineState>> list;
    for (const EngineStatus& e : coord_->Snapshot().engines) list.emplace_back(e.id, e.state);
    return list;
  };
  const PairState pair = coord_->pair_state();
  const bool upgrading = coord_->Snapshot().upgrade.has_value();
  const auto before = engines();
  const Status status = coord_->RequestUpgrade(UpgradeRequest{.command = {"missing-engine"}});
  Note("batonctl upgrade -- missing-engine: " + status.ToString());
  if (status.ok()) return Fail(step_, "an upgrade to a program that is not there was accepted");
  if (coord_->pair_state() != pair || engines() != before ||
      coord_->Snapshot().upgrade.has_value() != upgrading) {
    Fail(step_, "a refused upgrade moved something: " + status.ToString());
  }
}

// During an upgrade its canary is rolled back; after one, the previous command comes back
// by a canary of its own.
inline void Simulation::Rollback() {
  const Status status = coord_->RequestRollback();
  out_.stats.rollbacks += status.ok();
  Note("batonctl rollback: " + status.ToString());
}

inline void Simulation::DrainOrResume() {
  if (rng_.Chance(50)) return ResumeIfStopped();
  const Status status = coord_->RequestDrain();
  out_.stats.drains += status.ok();
  Note("batonctl drain: " + status.ToString());
}

inline void Simulation::ResumeIfStopped() {
  const PairState s = coord_->pair_state();
  if (s != PairState::kStopped && s != PairState::kDraining) return;
  const Status status = coord_->RequestResume();
  out_.stats.resumes += status.ok();
  Note("batonctl resume: " + status.ToString());
}

// The GPU fails for up to 300 ms: the controller's probe sees it, fences every engine and
// rebuilds its device memory once the device is back.
inline void Simulation::LoseDevice() {
  if (!cuda_backend_ || world_.device.lost) return;
  world_.LoseDevice(rng_.Millis(0, 300));
  Note("the device is lost");
}

inline void Simulation::CrashController() {
  ++out_.stats.restarts;
  RestartController();
}

// `batonctl stop`, then the controller started again later: nothing was kept (a clean stop
// leaves no memory to a successor), the roster lists engines that are all gone.
inline void Simulation::StopAndStartAgain() {
  ++out_.stats.shutdowns;
  Note("batonctl stop");
  ShutDown(config_.stop_grace);
  for (const auto& [id, e] : world_.engines()) {
    if (e.alive) world_.Flag("shutdown: engine " + std::to_string(id) + " runs on after the stop");
  }
  EndController();
  clock_.Set(clock_.Now() + milliseconds(100));
  world_.Settle();
  world_.ControllerRestarted();
  StartController(/*restart=*/true, /*memory_kept=*/false);
  Note("controller started again at durable epoch " + std::to_string(store_.current()));
}

}  // namespace baton::sim
