// SimEffects: the Coordinator's Effects carried out on the simulated world (sim_world.h),
// as the daemon carries them out on real processes (controller/controller_effects.cc).
//
// Launch starts a simulated engine with the id and token the Coordinator chose; Kill,
// Terminate and Drill act on its process; BarrierHeldBy asks the world whether the dead
// process's device work has drained; Send hands the message to the engine, which reacts in
// the world and queues its replies there (the driver delivers them later as events:
// nothing here calls back into the Coordinator). The roster and the command record go to a
// SimDisk, which outlives each simulated controller. RouterOutcomes are what the world's
// router saw, and the device calls act on the world's GPU (sim_services.h). Two deliberate faults
// prove the simulation's checks bite: `skip_barrier` answers the barrier as passed once the process
// is dead, and `release_at_once` reports a killed engine exited and past its barrier at the kill,
// while its process still runs and maps its blocks. DropDevice checks the Coordinator: every
// engine is killed before a lost device's memory goes. With a journal set, every effect is also
// written there as one line ("Kill(1)", "Send(2, Promote)", "SaveRoster"): the scenario tests
// (tests/controller/core/scenario_*_test.cc) read the story of an operation from it.
//
// Ownership: the driver owns the effects, the world and the disk; the effects keep
// references to both. Single-threaded.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "controller/core/effects.h"
#include "controller/core/roster.h"
#include "controller/upgrade/command_record.h"
#include "tests/controller/sim_world.h"

namespace baton::sim {

// The controller's state directory: what survives a controller crash.
struct SimDisk {
  std::optional<Roster> roster;
  std::optional<CommandRecord> commands;
  uint64_t incarnation = 0;
};

struct SimFaults {
  bool skip_barrier = false;     // the barrier passes as soon as the process is dead
  bool release_at_once = false;  // a killed engine is reported exited, past its barrier, at once
};

class SimEffects final : public Effects {
 public:
  SimEffects(SimWorld& world, SimDisk& disk, SimFaults faults)
      : world_(world), disk_(disk), faults_(faults) {}

  // --- what the driver reads ------------------------------------------------------------
  struct KillRecord {
    EngineId id = kNoEngine;
    bool was_working = false;  // alive, answering, not told to stop
  };
  // The Kill calls since the last call.
  std::vector<KillRecord> TakeKills() { return std::exchange(kills_, {}); }
  uint64_t reattach_acks() const { return reattach_acks_; }
  // Why the first refused Reattach was refused ("" if none was): every simulated engine
  // reattaches with the truth, which the roster must account for.
  const std::string& refused_reattach() const { return refused_reattach_; }
  const std::optional<proto::RouteTable>& routes() const { return routes_; }
  // Every effect from now on is appended to `journal` (nullptr: none).
  void SetJournal(std::vector<std::string>* journal) { journal_ = journal; }

  // --- processes --------------------------------------------------------------------------
  Result<std::string> NewToken() override { return "token-" + std::to_string(++tokens_); }
  // A program named "missing..." is not there: an upgrade to it is refused.
  Status CheckCommand(const std::vector<std::string>& command) override {
    if (!command.empty() && command[0].rfind("missing", 0) == 0) {
      return FailedPrecondition("engine program " + command[0] + ": No such file or directory");
    }
    return OkStatus();
  }
  Result<pid_t> Launch(const LaunchSpec& spec) override {
    Record("Launch(" + std::to_string(spec.id) + ", " + proto::ToString(spec.role) + ")");
    if (spec.command.empty()) return InvalidArgument("no engine command");
    if (!world_.Launch(spec.id, spec.token, spec.port, spec.command)) {
      return Internal("engine " + std::to_string(spec.id) + " exists");
    }
    return static_cast<pid_t>(10000 + spec.id);
  }
  bool Dying(EngineId id) override {
    const SimEngine* e = world_.Find(id);
    return e == nullptr || !e->alive;
  }
  bool Kill(EngineId id) override {
    Record("Kill(" + std::to_string(id) + ")");
    SimEngine* e = world_.Find(id);
    kills_.push_back(KillRecord{id, e != nullptr && e->Working()});
    const bool running = world_.Kill(id);
    if (faults_.release_at_once && running && !e->exit_reported) {
      world_.ReportExit(id, "killed by signal 9 (reported before it died)", Duration::zero());
    }
    return running;
  }
  void Terminate(EngineId id) override {
    Record("Terminate(" + std::to_string(id) + ")");
    world_.Stop(id);
  }
  Result<std::string> Drill(EngineId id, DrillKind kind) override {
    SimEngine* e = world_.Find(id);
    if (e == nullptr || !e->Working()) {
      return FailedPrecondition("engine " + std::to_string(id) + " is not running");
    }
    switch (kind) {
      case DrillKind::kKill:
        world_.Crash(id);
        return std::string(" by SIGKILL");
      case DrillKind::kHang:
        world_.Hang(id);
        return std::string(" by freezing it");
      case DrillKind::kError:
        if (!e->connected) return FailedPrecondition("not connected");
        world_.Send(*e, proto::ErrorReport{.epoch = e->epoch, .code = 13, .message = "drill"},
                    world_.rng().Millis(0, 5));
        return std::string(" by asking its SDK to report an error");
    }
    return InvalidArgument("unknown drill");
  }
  std::string BarrierHeldBy(EngineId id) override {
    SimEngine* e = world_.Find(id);
    if (e == nullptr) return "";
    if (faults_.release_at_once && e->killed) return "";
    if (faults_.skip_barrier && !e->alive) return "";
    std::string held = world_.BarrierHeldBy(id);
    if (held.empty()) Record("BarrierPassed(" + std::to_string(id) + ")", /*once=*/true);
    return held;
  }
  void Release(EngineId id) override {
    Record("Release(" + std::to_string(id) + ")");
    if (SimEngine* e = world_.Find(id)) e->released = true;
  }

  // --- channels ---------------------------------------------------------------------------
  Status Send(EngineId id, const ToEngine& message) override {
    Record("Send(" + std::to_string(id) + ", " + ToEngineName(message) + ")");
    reattach_acks_ += std::holds_alternative<proto::ReattachAck>(message);
    if (const auto* stop = std::get_if<proto::Stop>(&message);
        stop != nullptr && refused_reattach_.empty() &&
        stop->reason.rfind("reattach refused", 0) == 0) {
      refused_reattach_ = "engine " + std::to_string(id) + ": " + stop->reason;
    }
    return world_.Receive(id, message);
  }
  void Disconnect(EngineId id) override {
    Record("Disconnect(" + std::to_string(id) + ")");
    world_.Disconnect(id);
  }
  bool PublishRoutes(proto::RouteTable table) override {
    if (routes_.has_value() && routes_->epoch == table.epoch &&
        routes_->pair_state == table.pair_state && routes_->entries == table.entries) {
      return false;
    }
    routes_ = std::move(table);
    Record("PublishRoutes");
    return true;
  }
  std::map<uint64_t, proto::EngineOutcome> RouterOutcomes() const override {
    return world_.router.outcomes();
  }
  size_t RouterCount() const override { return 1; }

  // --- state on disk ----------------------------------------------------------------------
  Status SaveRoster(const Roster& roster) override {
    Record("SaveRoster", /*once=*/true);
    disk_.roster = roster;
    return OkStatus();
  }
  Status SaveCommandRecord(const CommandRecord& record) override {
    Record("SaveCommandRecord", /*once=*/true);
    disk_.commands = record;
    return OkStatus();
  }

  // --- device memory (the world's GPU: sim_services.h) -------------------------------------
  bool DeviceMemoryPresent() const override { return world_.device.present; }
  Status ProbeDevice() override {
    if (!world_.device.present) return Unavailable("no device memory");
    if (!world_.device.lost) return OkStatus();
    Record("ProbeDevice: lost");
    return Unavailable(world_.device.reason);
  }
  void DropDevice() override {
    Record("DropDevice");
    // What imported the lost device's memory must be fenced (killed) before the memory goes,
    // or it serves on from memory that is no longer there.
    for (const auto& [id, e] : world_.engines()) {
      if (e.alive && !e.killed) {
        world_.Flag("device: engine " + std::to_string(id) +
                    " still runs when the lost device's memory is dropped");
      }
    }
    world_.device.present = false;
  }
  Status RebuildDevice() override {
    if (world_.now() < world_.device.back_at) {
      Record("RebuildDevice: failed", /*once=*/true);
      return Unavailable("cuCtxCreate: CUDA_ERROR_NO_DEVICE (the device is not back yet)");
    }
    Record("RebuildDevice: ok");
    world_.device.lost = false;
    world_.device.present = true;
    return OkStatus();
  }

 private:
  // `once`: not again right after the same line (a roster written twice in one decision).
  void Record(const std::string& line, bool once = false) {
    if (journal_ == nullptr || (once && !journal_->empty() && journal_->back() == line)) return;
    journal_->push_back(line);
  }

  SimWorld& world_;
  SimDisk& disk_;
  SimFaults faults_;
  uint64_t tokens_ = 0;
  uint64_t reattach_acks_ = 0;
  std::string refused_reattach_;
  std::vector<KillRecord> kills_;
  std::optional<proto::RouteTable> routes_;
  std::vector<std::string>* journal_ = nullptr;
};

}  // namespace baton::sim
