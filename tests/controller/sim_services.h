// What the controller simulation (sim_world.h) models around the engines: the routers, which
// send requests where the last route table says and count what each engine did with them
// (the proto::EngineOutcome counters a canary is judged on), and the GPU, which can be lost
// and whose device memory the controller then drops and rebuilds (controller_memory.cc).
//
// A candidate engine command with "--bad" in it is a broken version: half its requests fail,
// so its canary is rolled back; any other version serves every request in about 10 ms.
//
// Ownership: the world owns both. Header-only test support; single-threaded.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "controller/core/canary.h"
#include "tests/controller/sim_engine.h"

namespace baton::sim {

// Every router, summed (as RoutePublisher::Outcomes() sums them).
class SimRouter {
 public:
  // `d` of traffic under `table`: an engine with weight w gets about d·w/4 ms⁻¹ requests.
  // An engine that does not answer (dead, frozen, fenced, not serving) fails every one.
  void Serve(const std::optional<proto::RouteTable>& table,
             const std::map<EngineId, SimEngine>& engines, Duration d, Rng& rng) {
    if (!table.has_value()) return;
    const uint64_t ms =
        static_cast<uint64_t>(std::chrono::duration_cast<milliseconds>(d).count()) + 1;
    for (const proto::RouteEntry& r : table->entries) {
      if (!r.ready || r.weight == 0) continue;
      const uint64_t n = std::max<uint64_t>(1, ms * r.weight / 400);
      proto::EngineOutcome& o = outcomes_[r.engine_id];
      o.engine_id = r.engine_id;
      o.requests += n;
      auto it = engines.find(r.engine_id);
      const bool answers = it != engines.end() && it->second.Working() && it->second.serving;
      if (!answers) {
        o.errors += n;
        continue;
      }
      const uint64_t failed = it->second.bad_version ? (n + 1) / 2 : 0;
      o.errors += failed;
      o.succeeded += n - failed;
      o.duration_ms += (n - failed) * rng.Range(9, 11);
    }
  }
  const OutcomeMap& outcomes() const { return outcomes_; }

 private:
  OutcomeMap outcomes_;
};

// The GPU the CUDA backend's device memory lives on.
struct SimDevice {
  bool lost = false;    // the device fails (a probe says so)
  bool present = true;  // the controller holds device memory (DropDevice: no more)
  TimePoint back_at{};  // a rebuild succeeds from then on (the device is usable again)
  uint64_t losses = 0;  // times the world lost it
  std::string reason = "CUDA_ERROR_ILLEGAL_ADDRESS: the device is lost";
};

}  // namespace baton::sim
