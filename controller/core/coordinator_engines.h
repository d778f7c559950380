// EnginePart: the Coordinator's part that launches engines and handles what they say:
// admission, Register, StandbyReady, heartbeats, leases, returns; the roster it writes before
// any engine can map what it was given, the route table it publishes, and the engines'
// deadlines and failure detectors it polls (coordinator_engines.cc, coordinator_roster.cc).
//
// Ownership: borrows the shared state and the other parts (coordinator_parts.h); owns no
// fields of its own (the engine records are shared). Thread: the Coordinator's.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "controller/core/coordinator_state.h"

namespace baton {

struct CoordinatorParts;

class EnginePart {
 public:
  EnginePart(CoordinatorState& s, const CoordinatorParts& p);

  // --- connections (coordinator_engines.cc) -------------------------------------------------
  // The engine whose launch token is `token` may connect: its id, or why not.
  Result<EngineId> Admit(const std::string& token) const;
  void OnConnected(EngineId id, uint16_t protocol);
  // Every engine is told to stop (or terminated).
  void BeginShutdown();

  // --- launching ----------------------------------------------------------------------------
  // When MaybeLaunch may start the next engine (nullopt: not now).
  std::optional<TimePoint> NextLaunchAt() const;
  void MaybeLaunch();

  // --- engine messages ----------------------------------------------------------------------
  void OnRegister(EngineRecord& e, const proto::Register& reg);
  void OnStandbyReady(EngineRecord& e, const proto::StandbyReady& msg);
  void OnHeartbeat(EngineRecord& e, const proto::Heartbeat& msg);
  // Its compute progress: watched (ProgressWatch) while compute_stall_timeout is set.
  void OnProgress(EngineRecord& e, const proto::Progress& msg);
  void OnLeaseRequest(EngineRecord& e, const proto::LeaseRequest& msg);
  void OnReturn(EngineRecord& e, const proto::ReturnExtents& msg);
  // What a promoted engine adopted of its predecessor's KV: into the promotion's timeline.
  void OnKvAdopted(EngineRecord& e, const proto::KvAdopted& msg);
  // How it took the KV of its predecessor's quarantined blocks: into the timeline.
  void OnKvInherited(EngineRecord& e, const proto::KvInherited& msg);
  // Whether `epoch` is the one `e` may speak at; otherwise it is told to stop and fenced.
  bool CheckEpoch(EngineRecord& e, uint64_t epoch, const char* what);
  // Refused (ErrorMsg): the engine stays.
  void RefuseEngine(EngineRecord& e, const Status& status);
  // Tells `e` to stop with `why`, records the refusal and fences it with `cause`.
  void StopAndFence(EngineRecord& e, FailCause cause, const std::string& why);
  void StartDetector(EngineRecord& e);
  // Sends to `e`; a send that fails fences it (the message's name in the reason).
  bool SendOrFail(EngineRecord& e, const ToEngine& message);
  // Grants `blocks` free blocks to holder `e` (the roster first); `who` for the log.
  void GrantFree(EngineRecord& e, uint32_t blocks, const char* who);

  // --- roster, routes, health (coordinator_roster.cc) ---------------------------------------
  void SaveRoster();
  void PublishRoutes();
  // Deadlines (register, promote, drain) and failure detectors: probes sent, engines fenced.
  void PollEngines();
  // When `e`'s compute may next be found stalled, for the Coordinator's wake-up; none for an
  // engine whose progress is not judged now (a standby, a primary draining): a deadline past
  // for one of those would wake the Coordinator at once, again and again.
  std::optional<TimePoint> ProgressDeadline(const EngineRecord& e) const;

 private:
  // Whether `e`'s progress is judged: it reports it, serves, and is the primary or a canary.
  bool ProgressJudged(const EngineRecord& e) const;
  // Why `e` is fenced as hung for a compute that stands still, or nullopt (coordinator_roster.cc).
  std::optional<std::string> ComputeStall(const EngineRecord& e) const;
  void Launch(proto::LaunchRole role);
  int PickPort() const;
  Roster MakeRoster() const;
  // The previous roster's epoch and blocks of engine `id`, when the ledger holds none for it.
  void HoldBack(const Roster* previous, EngineId id, RosterEngine& entry) const;

  CoordinatorState& s_;
  const CoordinatorParts& p_;
};

}  // namespace baton
