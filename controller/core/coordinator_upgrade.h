// UpgradePart: the Coordinator's part for engine-version upgrades by lossless canary
// (controller/core/upgrade.h): the standby makes way for a canary of the new command, the
// canary is promoted beside the primary on blocks the primary returns, takes a growing share
// of new requests step by step while the routers' outcomes are judged, and either takes over
// (the old primary drained) or is rolled back. Also the engine command record
// (controller/core/command_record.h): a promoted upgrade's command outlives a restart, and
// an upgrade in flight is resumed with the engines a restart re-adopts.
//
// Files: coordinator_upgrade_requests.cc (the operator's upgrade and rollback),
// coordinator_upgrade.cc (phases, ends), coordinator_upgrade_returns.cc (the primary's returns
// of blocks), coordinator_upgrade_record.cc (the command record, and the resumption after a
// restart).
//
// Ownership: owns UpgradeFields; borrows the shared state and the other parts
// (coordinator_parts.h). Thread: the Coordinator's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "controller/core/coordinator_state.h"
#include "controller/core/upgrade.h"

namespace baton {

struct CoordinatorParts;

struct UpgradeFields {
  std::optional<Upgrade> upgrade;  // in progress
  std::deque<UpgradeResult> history;
  std::vector<std::string> active_command;    // empty: config.engine_command
  std::vector<std::string> previous_command;  // what the last promoted upgrade replaced
  uint64_t promoted = 0;
  uint64_t rolled_back = 0;
  bool give_back_blocks = false;  // blocks were freed: those beside the reserve go to the primary
  // A return was taken for a Reclaim's answer: it may have been blocks the primary gave up of
  // its own accord, so a later return from `late_answer_from` until `late_answer_until` is
  // taken as the answer too (for the reserve's Reclaim or an upgrade's).
  EngineId late_answer_from = kNoEngine;
  TimePoint late_answer_until{};
  bool late_answer_for_reserve = false;
  // A canary that took over from a primary failing during its upgrade, until a heartbeat
  // shows it outlived that primary: one dying first (killed with it) undoes the upgrade.
  struct Takeover {
    EngineId canary = kNoEngine;
    TimePoint at{};  // a heartbeat a heartbeat_interval later was sent after it
    std::vector<std::string> active_command, previous_command;  // as before the switch
  };
  std::optional<Takeover> takeover;
};

class UpgradePart {
 public:
  UpgradePart(CoordinatorState& s, const CoordinatorParts& p);

  const UpgradeFields& own() const { return own_; }
  bool active() const { return own_.upgrade.has_value(); }
  bool IsCanary(EngineId id) const { return active() && own_.upgrade->canary == id; }
  // Whether `id` is the canary and its Promote is the upgrade's (not a failover's).
  bool PromotingCanary(EngineId id) const {
    return IsCanary(id) && own_.upgrade->phase == Upgrade::Phase::kPromoting;
  }
  // The command standbys run: the last promoted upgrade's, or engine.command.
  const std::vector<std::string>& active_command() const;
  // What the primary keeps of the pool while a canary runs beside it: a tenth (at least one).
  static uint32_t PrimaryKeeps(const CoordinatorConfig& config) {
    return std::max<uint32_t>(1, config.block_count / 10);
  }

  // --- operator commands ----------------------------------------------------------------------
  Status RequestUpgrade(UpgradeRequest request);
  Status RequestRollback(UpgradeRequest overrides);

  // --- events -----------------------------------------------------------------------------------
  // The command engine `id` is launched with (the canary's for the upgrade's standby).
  std::vector<std::string> CommandFor(EngineId id, proto::LaunchRole role);
  // The canary is a ready standby beside a serving primary: its blocks are reclaimed.
  void StartCanary(EngineRecord& e);
  // The primary returned blocks (a Reclaim's answer, or of its own accord).
  void OnPrimaryReturned();
  void OnCanaryPromoted(EngineRecord& e, uint64_t epoch);
  void OnCanaryGone(EngineRecord& e);
  // The primary `old` failed or drained: a serving canary takes over; false if there is none.
  bool CanaryTakesOver(EngineRecord& old) { return CanaryTakesOver(old.id, old.fail_reason); }
  // The same for a primary whose record is gone (`lost`: why it failed; empty when drained).
  bool CanaryTakesOver(EngineId old, const std::string& lost);
  // A heartbeat from engine `id`: a canary that took over has outlived the failed primary.
  void OnHeartbeat(EngineId id);
  // The primary `e` failed: a canary that took over and failed before its first heartbeat
  // since is taken to have died with the old primary, and its upgrade is rolled back (the
  // command before it restored; standbys of the new one are retired on the next tick).
  void OnPrimaryFailed(const EngineRecord& e);
  void EndUpgrade(UpgradeOutcome outcome, const std::string& reason);
  void TickUpgrade();
  // Once a canary is gone, or a fenced engine's blocks are freed with no successor to take
  // them, the free blocks beside the reserve go back to the primary (on a tick: not while an
  // upgrade runs, nor while blocks await a barrier).
  void GiveFreeBlocksToPrimary();
  void FreeBlocksGoToPrimary() { own_.give_back_blocks = true; }
  // Standbys still running a command an upgrade replaced are stopped.
  void RetireStaleStandbys();

  // --- the command record (coordinator_upgrade_record.cc) -----------------------------------
  void LoadCommands(const StartState& found);
  // An upgrade in flight when the previous controller went away goes on where its engines
  // are, or is rolled back: what happened, for the recovery's status.
  std::string ResumeUpgrade(const InFlightUpgrade& in_flight);

 private:
  // An upgrade (or a rollback: an upgrade back to the previous command).
  Status StartUpgrade(UpgradeRequest request, UpgradeKind kind);
  // Whether the pair can take an upgrade: a serving primary beside a ready standby, or one
  // whose standby is not ready (crash-looping, say: the canary replaces it).
  Status CheckPairTakesCanary() const;
  // The standby, ready or not, is stopped for the canary, and a crash-loop backoff lifted.
  void MakeWayForCanary();
  // With no engine serving there is nothing to judge a canary against: `command` becomes the
  // active one at once (recorded as promoted), and engines launch with it from now on.
  Status SwitchCommandNow(std::vector<std::string> command, UpgradeKind kind);
  void SetPhase(Upgrade::Phase phase);
  void ReclaimFromPrimary(uint32_t weight);
  // Whether a return from the primary may be the late answer to a Reclaim.
  bool LateReclaimAnswer() const;
  void PromoteCanary();
  void TickCanary();
  void GrantFreeToCanary();
  void FinishUpgrade();
  void RollBackCanary(const std::string& reason);
  // The promotion reserve is counted in the canary's share until the upgrade ends.
  void LendReserveToCanary();
  void SaveCommands();
  // An upgrade in flight that a restart ended: recorded as rolled back with `reason`.
  void RecordInterruptedUpgrade(const InFlightUpgrade& u, const std::string& reason);
  // ResumeUpgrade's steps: the upgrade as the record saved it, against primary `p`; why it
  // cannot go on ("" if it can); the phase it goes on in; the canary named, the reserve lent,
  // the record saved and a PromoteAck held during the recovery acted on.
  Upgrade UpgradeFromRecord(const InFlightUpgrade& u, const EngineRecord* p) const;
  std::string WhyNotResumed(const Upgrade& up, const EngineRecord* c, const EngineRecord* p) const;
  std::string ResumePhase(Upgrade up, const InFlightUpgrade& u, EngineRecord& c, EngineRecord& p);
  void FinishResume(const InFlightUpgrade& u, EngineRecord* c, bool old_primary_drained,
                    const std::string& outcome);

  CoordinatorState& s_;
  const CoordinatorParts& p_;
  UpgradeFields own_;
};

}  // namespace baton
