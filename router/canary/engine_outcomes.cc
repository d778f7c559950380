#include "router/canary/engine_outcomes.h"

#include <algorithm>

namespace baton {

EngineOutcomes::Engine& EngineOutcomes::At(const std::string& node, uint64_t engine_id) {
  const Key key{node, engine_id};
  auto [it, added] = engines_.try_emplace(key);
  if (added) {
    it->second.outcome.engine_id = engine_id;
    if (!Listed(key)) it->second.unlisted_since = listed_at_;
  }
  return it->second;
}

bool EngineOutcomes::Listed(const Key& key) const {
  if (!listed_) return true;
  auto node = listed_->find(key.first);
  return node != listed_->end() && node->second.count(key.second) != 0;
}

void EngineOutcomes::RecordSucceeded(const std::string& node, uint64_t engine_id,
                                     Duration arrival_to_last_byte) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(arrival_to_last_byte);
  MutexLock lock(mu_);
  proto::EngineOutcome& o = At(node, engine_id).outcome;
  ++o.requests;
  ++o.succeeded;
  o.duration_ms += static_cast<uint64_t>(std::max<int64_t>(0, ms.count()));
}

void EngineOutcomes::RecordFailed(const std::string& node, uint64_t engine_id) {
  MutexLock lock(mu_);
  proto::EngineOutcome& o = At(node, engine_id).outcome;
  ++o.requests;
  ++o.errors;
}

void EngineOutcomes::RecordEnded(const std::string& node, uint64_t engine_id) {
  MutexLock lock(mu_);
  ++At(node, engine_id).outcome.requests;
}

void EngineOutcomes::RecordComparison(const std::string& node, uint64_t canary_engine_id,
                                      bool agreed) {
  MutexLock lock(mu_);
  proto::EngineOutcome& o = At(node, canary_engine_id).outcome;
  ++o.compared;
  if (!agreed) ++o.disagreed;
}

void EngineOutcomes::Hold(const std::string& node, uint64_t engine_id) {
  MutexLock lock(mu_);
  ++held_[{node, engine_id}];
}

void EngineOutcomes::Release(const std::string& node, uint64_t engine_id) {
  MutexLock lock(mu_);
  auto it = held_.find({node, engine_id});
  if (it != held_.end() && --it->second == 0) held_.erase(it);
}

void EngineOutcomes::SetListed(const Listing& listed, TimePoint now) {
  MutexLock lock(mu_);
  listed_ = listed;
  listed_at_ = now;
  for (auto& [key, e] : engines_) {
    if (Listed(key)) {
      e.unlisted_since.reset();
    } else if (!e.unlisted_since) {
      e.unlisted_since = now;
    }
  }
}

size_t EngineOutcomes::Prune(TimePoint now, Duration retention) {
  MutexLock lock(mu_);
  size_t pruned = 0;
  for (auto it = engines_.begin(); it != engines_.end();) {
    const std::optional<TimePoint>& since = it->second.unlisted_since;
    if (since && now - *since >= retention && held_.count(it->first) == 0) {
      it = engines_.erase(it);
      ++pruned;
    } else {
      ++it;
    }
  }
  return pruned;
}

std::vector<proto::EngineOutcome> EngineOutcomes::Snapshot(const std::string& node) const {
  MutexLock lock(mu_);
  std::vector<proto::EngineOutcome> out;
  for (auto it = engines_.lower_bound({node, 0}); it != engines_.end() && it->first.first == node;
       ++it) {
    out.push_back(it->second.outcome);
  }
  return out;
}

std::vector<std::string> EngineOutcomes::Nodes() const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [key, e] : engines_) {
    if (out.empty() || out.back() != key.first) out.push_back(key.first);
  }
  return out;
}

}  // namespace baton
