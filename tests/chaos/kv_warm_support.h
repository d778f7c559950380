// What the KV-warm failover drills (kv_warm_test.cc, torch_engine_test.cc) read of the engines
// and the controller: the primary's metrics and the latest promotion's `batonctl timeline` kv.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "tests/chaos/router_stream_support.h"

namespace baton::chaos {

// The HTTP port of an engine of `batonctl status --json`.
inline uint16_t EnginePort(const json& engine) {
  const std::string address = engine.value("http_address", "");
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

// A series of the primary's /metrics; 0 for a labelled series not rendered yet.
inline double EngineMetric(const ChaosCluster& cluster, const std::string& series) {
  return std::max(0.0,
                  MetricValue(EnginePort(EngineWithRole(cluster.Status(), "primary")), series));
}

// The kv part of the latest promotion's `batonctl timeline` (null until the engine reported
// what it adopted).
inline json LastTimelineKv(const ChaosCluster& cluster) {
  for (int i = 0; i < 100; ++i) {
    const CtlResult t = cluster.Ctl({"timeline"});
    if (t.out.is_object() && t.out["timeline"].is_object() && t.out["timeline"].contains("kv")) {
      return t.out["timeline"]["kv"];
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return nullptr;
}

}  // namespace baton::chaos
