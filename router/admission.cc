#include "router/admission.h"

#include <algorithm>
#include <cmath>

#include "base/log.h"

namespace baton {

bool IsOutOfService(const proto::RouteTable& table) {
  return table.pair_state == "draining" || table.pair_state == "stopped";
}

Admission::Admission(const Clock& clock, AdmissionOptions options, std::string node)
    : clock_(clock), options_(std::move(options)), node_(std::move(node)) {
  if (options_.ramp_steps.empty()) options_.ramp_steps.push_back(1.0);
}

void Admission::SetTable(const proto::RouteTable& table) {
  Ready ready;
  {
    MutexLock lock(mu_);
    std::vector<Target> canaries = WeightedCanaries(table);
    const std::optional<Target> primary = ListCandidates(table, canaries.empty());
    ++generation_;
    refused_.clear();
    NotePrimary(primary, table.epoch);
    listed_primary_ = primary;
    pair_state_ = table.pair_state;
    out_of_service_ = IsOutOfService(table);
    canaries_ = std::move(canaries);
    TrackCanaryIds(table);
    Drain(clock_.Now(), &ready);
  }
  Run(&ready);
}

std::vector<Target> Admission::WeightedCanaries(const proto::RouteTable& table) const {
  std::vector<Target> canaries;
  for (const proto::RouteEntry& e : table.entries) {
    if (e.ready && !e.http_address.empty() && e.role == proto::EngineRole::kCanary &&
        e.weight > 0) {
      canaries.push_back({.address = e.http_address, .engine_id = e.engine_id, .node = node_});
    }
  }
  return canaries;
}

std::optional<Target> Admission::ListCandidates(const proto::RouteTable& table, bool no_canary) {
  std::vector<Candidate> next;
  std::optional<Target> primary;
  for (const proto::RouteEntry& e : table.entries) {
    if (!e.ready || e.http_address.empty()) continue;
    const bool is_primary = e.role == proto::EngineRole::kPrimary;
    if (!is_primary && e.role != proto::EngineRole::kCanary) continue;
    // A weightless primary takes everything, unless a canary took its traffic: then it
    // stays listed with weight 0, for replays only.
    // Weights are percentages (a record past 100 is refused when read); capped here too, so
    // that no table can overflow the weighted round robin.
    const int weight = e.weight > 0 ? static_cast<int>(std::min<uint32_t>(e.weight, 100))
                                    : (is_primary && no_canary ? 100 : 0);
    if (weight == 0 && !is_primary) continue;
    Candidate c{.target = {.address = e.http_address, .engine_id = e.engine_id, .node = node_},
                .weight = weight};
    for (const Candidate& old : candidates_) {
      if (old.target == c.target) c.current = old.current;
    }
    next.push_back(c);
    if (is_primary && !primary) primary = c.target;
  }
  candidates_ = std::move(next);
  return primary;
}

void Admission::NotePrimary(const std::optional<Target>& primary, uint64_t epoch) {
  if (!primary) return;
  // After a controller restart the same engine at the same epoch is the same primary,
  // re-adopted: no failover. Another engine, or a new epoch, is a new primary.
  const bool readopted = primary_ && *primary == *primary_ && epoch == primary_epoch_;
  if (primary_ && (*primary != *primary_ || (primary_stale_ && !readopted))) {
    ++failovers_;
    const size_t peak_before = peak_in_flight_;
    peak_in_flight_ = total_in_flight_;
    // A canary of the last table carries traffic already: taking over is not a cold start.
    if (std::find(canaries_.begin(), canaries_.end(), *primary) != canaries_.end()) {
      BATON_LOG(INFO, "router") << "canary " << primary->address << " (engine "
                                << primary->engine_id << ") is the primary now: no ramp";
      ramp_target_.reset();
    } else {
      ramp_target_ = primary;
      ramp_start_ = clock_.Now();
      ramp_base_ = std::max<size_t>(1, peak_before);
      BATON_LOG(INFO, "router") << "new primary " << primary->address << " (engine "
                                << primary->engine_id << "): ramping over "
                                << options_.ramp_duration.count() << " ms from a base of "
                                << ramp_base_ << " in flight";
    }
  }
  if (primary_stale_ && readopted) {
    BATON_LOG(INFO, "router") << "the new controller re-adopted primary " << primary->address
                              << " (engine " << primary->engine_id << ", epoch " << epoch
                              << "): no failover";
  }
  primary_ = primary;
  primary_epoch_ = epoch;
  primary_stale_ = false;
}

// An engine stays a canary (for IsCanary) until it leaves the table or becomes the primary:
// a canary rolled back (draining) may still answer attempts sent before.
void Admission::TrackCanaryIds(const proto::RouteTable& table) {
  std::set<uint64_t> listed;
  for (const proto::RouteEntry& e : table.entries) {
    listed.insert(e.engine_id);
    if (e.role == proto::EngineRole::kCanary) canary_ids_.insert(e.engine_id);
    if (e.role == proto::EngineRole::kPrimary) canary_ids_.erase(e.engine_id);
  }
  std::erase_if(canary_ids_, [&](uint64_t id) { return listed.count(id) == 0; });
}

uint64_t Admission::Request(bool replay, std::optional<Target> failed, Grant grant) {
  Ready ready;
  uint64_t ticket;
  {
    MutexLock lock(mu_);
    const TimePoint now = clock_.Now();
    ticket = next_ticket_++;
    Waiter w{.ticket = ticket,
             .replay = replay,
             .failed = std::move(failed),
             .failed_generation = generation_,
             .failed_at = now,
             .deadline = now + options_.max_queue_wait,
             .grant = std::move(grant)};
    auto pos = queue_.end();
    if (replay) {
      pos = std::find_if(queue_.begin(), queue_.end(), [](const Waiter& q) { return !q.replay; });
    }
    queue_.insert(pos, std::move(w));
    Drain(now, &ready);
    // A new request that could not go at once waits only if the queue had room for it.
    if (!replay && queue_.size() > options_.max_queue && !queue_.empty() &&
        queue_.back().ticket == ticket) {
      ready.emplace_back(std::move(queue_.back().grant),
                         ResourceExhausted("the router's queue is full (" +
                                           std::to_string(options_.max_queue) + " requests)"));
      queue_.pop_back();
    }
  }
  Run(&ready);
  return ticket;
}

void Admission::Cancel(uint64_t ticket) {
  Ready ready;
  {
    MutexLock lock(mu_);
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [ticket](const Waiter& w) { return w.ticket == ticket; });
    if (it == queue_.end()) return;
    ready.emplace_back(std::move(it->grant), Unavailable("the client went away while queued"));
    queue_.erase(it);
    // A new request that was first in line held later ones behind it.
    Drain(clock_.Now(), &ready);
  }
  Run(&ready);
}

void Admission::Release(const Target& target) {
  Ready ready;
  {
    MutexLock lock(mu_);
    auto it = in_flight_.find(target.address);
    if (it != in_flight_.end() && it->second > 0) {
      if (--it->second == 0) in_flight_.erase(it);
      --total_in_flight_;
    }
    Drain(clock_.Now(), &ready);
  }
  Run(&ready);
}

void Admission::Unreachable(const Target& target) {
  MutexLock lock(mu_);
  const bool listed = std::any_of(candidates_.begin(), candidates_.end(),
                                  [&](const Candidate& c) { return c.target == target; });
  if (!listed) return;
  if (refused_.count(target.address) == 0) {
    BATON_LOG(INFO, "router")
        << target.address << " (engine " << target.engine_id
        << ") refuses requests (its connections, or this router's engine key): "
        << "requests wait for the route to change";
  }
  refused_[target.address] = clock_.Now();
}

void Admission::Tick() {
  Ready ready;
  {
    MutexLock lock(mu_);
    const TimePoint now = clock_.Now();
    if (ramp_target_ && now - ramp_start_ >= options_.ramp_duration) {
      BATON_LOG(INFO, "router") << "ramp onto " << ramp_target_->address << " complete";
      ramp_target_.reset();
    }
    Drain(now, &ready);
  }
  Run(&ready);
}

void Admission::Evict() {
  Ready ready;
  {
    MutexLock lock(mu_);
    for (Waiter& w : queue_) {
      ready.emplace_back(std::move(w.grant), Unavailable("node " + node_ + " left the route"));
    }
    queue_.clear();
    candidates_.clear();
    canaries_.clear();
    listed_primary_.reset();
    out_of_service_ = false;
    ++generation_;
  }
  Run(&ready);
}

void Admission::ControllerRestarted() {
  MutexLock lock(mu_);
  primary_stale_ = primary_.has_value();
}

void Admission::Drain(TimePoint now, Ready* ready) {
  bool fifo_blocked = false;  // a waiting new request keeps later new requests behind it
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (now >= it->deadline) {
      const std::string why = it->replay ? "no engine took over the request within "
                                         : "no engine could take the request within ";
      ready->emplace_back(
          std::move(it->grant),
          DeadlineExceeded(why + std::to_string(options_.max_queue_wait.count()) + " ms"));
      it = queue_.erase(it);
      continue;
    }
    std::optional<Target> t;
    if (it->replay || !fifo_blocked) t = Pick(*it, now);
    // No target listed, and none comes until `batonctl resume`: no wait. (A listed one that
    // Pick() passed over for now, a ramp's cap or a refused address, is waited for.)
    if (!t && out_of_service_ && candidates_.empty()) {
      ready->emplace_back(std::move(it->grant), OutOfServiceError());
      it = queue_.erase(it);
      continue;
    }
    if (!t) {
      if (!it->replay) fifo_blocked = true;
      ++it;
      continue;
    }
    Take(*t);
    ready->emplace_back(std::move(it->grant), std::move(*t));
    it = queue_.erase(it);
  }
}

// An address that refused a connection gets nothing until retry_same_after has passed.
bool Admission::Refused(const Target& t, TimePoint now) const {
  const auto it = refused_.find(t.address);
  return it != refused_.end() && now - it->second < options_.retry_same_after;
}

std::optional<Target> Admission::Pick(const Waiter& w, TimePoint now) {
  const bool avoid_failed = w.failed && w.failed_generation == generation_ &&
                            now - w.failed_at < options_.retry_same_after;
  int total = 0;
  Candidate* best = nullptr;
  for (Candidate& c : candidates_) {
    if (c.weight == 0) continue;
    if (avoid_failed && c.target == *w.failed) continue;
    if (Refused(c.target, now)) continue;
    if (!w.replay && !UnderRampCap(c.target, now)) continue;
    total += c.weight;
    c.current += c.weight;
    if (best == nullptr || c.current > best->current) best = &c;
  }
  if (best != nullptr) {
    best->current -= total;
    return Marked(best->target);
  }
  // Only weightless targets left (a primary whose traffic a canary took): a replay may go
  // there rather than wait.
  if (!w.replay) return std::nullopt;
  for (const Candidate& c : candidates_) {
    if (avoid_failed && c.target == *w.failed) continue;
    if (Refused(c.target, now)) continue;
    return Marked(c.target);
  }
  return std::nullopt;
}

Status Admission::OutOfServiceError() const {
  return FailedPrecondition("the service was taken out of service by its operator (pair " +
                            pair_state_ + (node_.empty() ? "" : " on node " + node_) +
                            ", batonctl drain): no engine serves it until batonctl resume");
}

Target Admission::Marked(Target t) const {
  t.canary = canary_ids_.count(t.engine_id) != 0;
  return t;
}

double Admission::RampShare(TimePoint now) const {
  const size_t n = options_.ramp_steps.size();
  const auto step = options_.ramp_duration / static_cast<int64_t>(n);
  if (step.count() <= 0) return 1.0;
  const auto i = static_cast<size_t>((now - ramp_start_) / step);
  return i >= n ? 1.0 : options_.ramp_steps[i];
}

bool Admission::UnderRampCap(const Target& t, TimePoint now) const {
  if (!ramp_target_ || t != *ramp_target_) return true;
  const double share = RampShare(now);
  if (share >= 1.0) return true;
  const size_t cap =
      std::max<size_t>(1, static_cast<size_t>(std::ceil(share * static_cast<double>(ramp_base_))));
  auto it = in_flight_.find(t.address);
  return it == in_flight_.end() || it->second < cap;
}

void Admission::Take(const Target& t) {
  ++in_flight_[t.address];
  ++total_in_flight_;
  peak_in_flight_ = std::max(peak_in_flight_, total_in_flight_);
}

void Admission::Run(Ready* ready) {
  for (auto& [grant, result] : *ready) grant(std::move(result));
}

bool Admission::IsCanary(const Target& target) const {
  MutexLock lock(mu_);
  return canary_ids_.count(target.engine_id) != 0;
}

std::optional<Target> Admission::Primary() const {
  MutexLock lock(mu_);
  return listed_primary_;
}

bool Admission::OutOfService() const {
  MutexLock lock(mu_);
  return out_of_service_;
}

size_t Admission::queued() const {
  MutexLock lock(mu_);
  return queue_.size();
}

size_t Admission::in_flight() const {
  MutexLock lock(mu_);
  return total_in_flight_;
}

uint64_t Admission::failovers() const {
  MutexLock lock(mu_);
  return failovers_;
}

std::vector<TargetWeight> Admission::Weights() const {
  MutexLock lock(mu_);
  const TimePoint now = clock_.Now();
  int total = 0;
  for (const Candidate& c : candidates_) total += c.weight;
  std::vector<TargetWeight> out;
  for (const Candidate& c : candidates_) {
    double share = total > 0 ? 100.0 * c.weight / total : 0;
    if (ramp_target_ && c.target == *ramp_target_) share *= RampShare(now);
    out.push_back({c.target, share,
                   primary_ && c.target == *primary_ ? proto::EngineRole::kPrimary
                                                     : proto::EngineRole::kCanary});
  }
  return out;
}

int Admission::RetryAfterSeconds() const {
  const auto ms = options_.max_queue_wait.count();
  return static_cast<int>(std::max<int64_t>(1, (ms + 999) / 1000));
}

}  // namespace baton
