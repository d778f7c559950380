#include "router/canary/engine_outcomes.h"

#include <algorithm>

namespace baton {

proto::EngineOutcome& EngineOutcomes::At(const std::string& node, uint64_t engine_id) {
  proto::EngineOutcome& o = engines_[{node, engine_id}];
  o.engine_id = engine_id;
  return o;
}

void EngineOutcomes::RecordSucceeded(const std::string& node, uint64_t engine_id,
                                     Duration arrival_to_last_byte) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(arrival_to_last_byte);
  MutexLock lock(mu_);
  proto::EngineOutcome& o = At(node, engine_id);
  ++o.requests;
  ++o.succeeded;
  o.duration_ms += static_cast<uint64_t>(std::max<int64_t>(0, ms.count()));
}

void EngineOutcomes::RecordFailed(const std::string& node, uint64_t engine_id) {
  MutexLock lock(mu_);
  proto::EngineOutcome& o = At(node, engine_id);
  ++o.requests;
  ++o.errors;
}

void EngineOutcomes::RecordEnded(const std::string& node, uint64_t engine_id) {
  MutexLock lock(mu_);
  ++At(node, engine_id).requests;
}

void EngineOutcomes::RecordComparison(const std::string& node, uint64_t canary_engine_id,
                                      bool agreed) {
  MutexLock lock(mu_);
  proto::EngineOutcome& o = At(node, canary_engine_id);
  ++o.compared;
  if (!agreed) ++o.disagreed;
}

std::vector<proto::EngineOutcome> EngineOutcomes::Snapshot(const std::string& node) const {
  MutexLock lock(mu_);
  std::vector<proto::EngineOutcome> out;
  for (auto it = engines_.lower_bound({node, 0}); it != engines_.end() && it->first.first == node;
       ++it) {
    out.push_back(it->second);
  }
  return out;
}

std::vector<std::string> EngineOutcomes::Nodes() const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [key, o] : engines_) {
    if (out.empty() || out.back() != key.first) out.push_back(key.first);
  }
  return out;
}

}  // namespace baton
