// Degradations: the ways a running controller can serve below what its configuration asked,
// without failing: the weight arena or the pool on normal pages instead of huge pages, the
// arena not mlocked, the memory not kept by baton-keeper (a controller restart then reloads
// the weights and fences the engines), the fleet's etcd reached in plain HTTP off the host
// (fleet/plaintext_etcd.h: anyone on the path reads and writes the fleet's records), engines
// listening off the loopback with no engine key (proto/http/engine_key.h: anyone who reaches
// their ports is served, past the router). Each is a metric, a line of `batonctl status` and
// an entry of its JSON, so that none is only a WARN line in a log nobody reads.
//
// A setting the operator turned off (model.huge_pages = false, model.lock = false,
// controller.keep_memory = false) is not a degradation. Plain functions of a status copy;
// thread-compatible.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/controller_status.h"

namespace baton {

struct Degradation {
  std::string what;  // a metric label: one of DegradationKinds()
  std::string why;   // for people
};

// Every kind, in a fixed order (the metric exports each, 0 or 1).
const std::vector<std::string>& DegradationKinds();
std::vector<Degradation> Degradations(const ControllerStatus& status);

// baton_degraded{what} for every kind, and the facts behind them: baton_weights_huge_pages,
// baton_weights_locked, baton_pool_huge_pages, baton_memory_kept.
std::string DegradationMetrics(const ControllerStatus& status);
// One "degraded: WHAT: WHY" line each; "" when none.
std::string DegradationText(const ControllerStatus& status);
// [{"what": ..., "why": ...}, ...]
nlohmann::json DegradationJson(const ControllerStatus& status);

// The `engines_open` degradation's words, for engines that listen on `host` without a key.
std::string EnginesOpenWarning(const std::string& host);

}  // namespace baton
