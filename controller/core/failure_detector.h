// FailureDetector: decides when a silent engine is hung, for one engine.
//
// The engine SDK sends heartbeats from its own thread, independent of the compute loop, so
// a slow engine under load keeps beating. When no heartbeat has arrived for
// heartbeat_interval x misses (defaults 100 ms x 3) the detector asks the controller to send
// one health request; only if no heartbeat or health reply arrives within probe_timeout is
// the engine declared hung, and the controller then SIGKILLs it through its pidfd. The kill
// is returned once; a probe more only as kProbeAgain, kMaxLateProbes at most. Process death
// (pidfd), socket EOF and SDK error reports bypass this detector entirely.
//
// Pure logic over an injected Clock; the controller calls Poll from a timer armed at
// NextDeadline(). Ownership: the controller owns one per engine; the Clock must outlive it.
// Thread: io_context thread only.
#pragma once

#include <chrono>

#include "base/clock.h"

namespace baton {

class FailureDetector {
 public:
  struct Options {
    Duration heartbeat_interval = std::chrono::milliseconds(100);
    int misses = 3;
    Duration probe_timeout = std::chrono::milliseconds(100);
  };

  enum class State {
    kHealthy,  // heartbeats arriving
    kProbing,  // heartbeats missed; a health request is out
    kHung,     // no answer to the health request: the engine must be killed
  };

  enum class Action {
    kNone,
    kSendProbe,    // send one health request now
    kProbeAgain,   // the verdict came late (the controller stalled), or another engine is
                   // silent too (the host stalled): send one more
    kDeclareHung,  // kill the engine (through its pidfd) and fence it
  };

  // Starts healthy, as if a heartbeat arrived now.
  FailureDetector(const Clock& clock, Options options);
  explicit FailureDetector(const Clock& clock) : FailureDetector(clock, Options()) {}

  // A heartbeat arrived. Ignored once hung: the kill is already decided.
  void OnHeartbeat();
  // The engine answered the health request; same effect as a heartbeat.
  void OnHealthReply() { OnHeartbeat(); }

  // Advances the detector to the clock's now and returns what the controller must do.
  // `others_silent`: another engine of the controller is silent past suspect_after() too.
  // Engines rarely hang together; a host short of CPU (or a stalled controller) silences them
  // all at once: the verdict is put off by a health request more, kMaxLateProbes at most.
  Action Poll(bool others_silent = false);
  // Whether the engine has been silent past suspect_after() (probing, or due to be).
  bool Silent() const;

  State state() const { return state_; }
  // When Poll may next return an action (arm a timer for it).
  TimePoint NextDeadline() const;
  TimePoint last_heartbeat() const { return last_heartbeat_; }
  // Health requests sent again (a late verdict, others silent), since the last heartbeat.
  int late_probes() const { return late_probes_; }
  static constexpr int kMaxLateProbes = 2;
  // The silence after which a probe is sent: heartbeat_interval x misses.
  Duration suspect_after() const { return options_.heartbeat_interval * options_.misses; }

 private:
  bool PastSuspect(TimePoint now) const { return now - last_heartbeat_ >= suspect_after(); }

  const Clock* clock_;
  Options options_;
  State state_ = State::kHealthy;
  TimePoint last_heartbeat_;
  TimePoint probe_sent_;
  int late_probes_ = 0;
};

const char* ToString(FailureDetector::State state);

}  // namespace baton
