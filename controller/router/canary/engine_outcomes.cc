#include "controller/router/canary/engine_outcomes.h"

#include <algorithm>

namespace baton {

proto::EngineOutcome& EngineOutcomes::At(uint64_t engine_id) {
  proto::EngineOutcome& o = engines_[engine_id];
  o.engine_id = engine_id;
  return o;
}

void EngineOutcomes::RecordSucceeded(uint64_t engine_id, Duration arrival_to_last_byte) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(arrival_to_last_byte);
  std::lock_guard<std::mutex> lock(mu_);
  proto::EngineOutcome& o = At(engine_id);
  ++o.requests;
  ++o.succeeded;
  o.duration_ms += static_cast<uint64_t>(std::max<int64_t>(0, ms.count()));
}

void EngineOutcomes::RecordFailed(uint64_t engine_id) {
  std::lock_guard<std::mutex> lock(mu_);
  proto::EngineOutcome& o = At(engine_id);
  ++o.requests;
  ++o.errors;
}

void EngineOutcomes::RecordEnded(uint64_t engine_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ++At(engine_id).requests;
}

void EngineOutcomes::RecordComparison(uint64_t canary_engine_id, bool agreed) {
  std::lock_guard<std::mutex> lock(mu_);
  proto::EngineOutcome& o = At(canary_engine_id);
  ++o.compared;
  if (!agreed) ++o.disagreed;
}

std::vector<proto::EngineOutcome> EngineOutcomes::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<proto::EngineOutcome> out;
  out.reserve(engines_.size());
  for (const auto& [id, o] : engines_) out.push_back(o);
  return out;
}

}  // namespace baton
