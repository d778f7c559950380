#include "router/fleet/fleet_admission.h"

#include <algorithm>

#include "base/log.h"

namespace baton {
namespace {

bool SameRoutes(const proto::RouteTable& a, const proto::RouteTable& b) {
  return a.epoch == b.epoch && a.pair_state == b.pair_state && a.entries == b.entries;
}

}  // namespace

FleetAdmission::FleetAdmission(const Clock& clock, AdmissionOptions options,
                               std::chrono::milliseconds suspect_for)
    : clock_(clock), options_(std::move(options)), suspect_for_(suspect_for) {}

void FleetAdmission::SetNodes(const std::vector<FleetNode>& nodes) {
  std::vector<std::pair<std::shared_ptr<Admission>, proto::RouteTable>> tables;
  std::vector<std::shared_ptr<Admission>> restarted, left;
  std::vector<std::function<void()>> lost;
  {
    MutexLock lock(mu_);
    viewed_ = true;
    std::map<std::string, bool> now_listed;
    for (const FleetNode& n : nodes) {
      now_listed[n.name] = true;
      Node& node = nodes_[n.name];
      if (!node.admission) {
        node.admission = std::make_shared<Admission>(clock_, options_, n.name);
      }
      const bool new_controller =
          node.controller_pid != 0 && (node.controller_pid != n.controller_pid ||
                                       node.controller_started_at != n.controller_started_at);
      if (new_controller) restarted.push_back(node.admission);
      if (!node.listed || new_controller || !SameRoutes(node.routes, n.routes)) {
        tables.emplace_back(node.admission, n.routes);
      }
      if (!node.listed) {
        BATON_LOG(INFO, "router") << "fleet node " << n.name << " (model " << n.model
                                  << ") is listed: it takes requests";
      }
      node.listed = true;
      node.model = n.model;
      node.controller_pid = n.controller_pid;
      node.controller_started_at = n.controller_started_at;
      node.routes = n.routes;
      node.load = n.Load();
    }
    for (auto& [name, node] : nodes_) {
      if (!node.listed || now_listed.count(name) != 0) continue;
      node.listed = false;
      node.left_at = clock_.Now();
      left.push_back(node.admission);
      for (auto it = watches_.begin(); it != watches_.end();) {
        if (it->second.node != name) {
          ++it;
          continue;
        }
        lost.push_back(std::move(it->second.lost));
        it = watches_.erase(it);
      }
      BATON_LOG(WARN, "router") << "fleet node " << name
                                << " left (its lease expired): " << lost.size()
                                << " attempts in flight replayed elsewhere";
    }
  }
  for (auto& a : restarted) a->ControllerRestarted();
  for (auto& [a, table] : tables) a->SetTable(table);
  for (auto& a : left) a->Evict();
  for (auto& f : lost) f();
  DrainQueue();
}

uint64_t FleetAdmission::Request(AdmitRequest request, Grant grant) {
  uint64_t ticket;
  {
    MutexLock lock(mu_);
    ticket = next_ticket_++;
  }
  Dispatch(ticket, std::move(request), std::move(grant), clock_.Now() + options_.max_queue_wait);
  return ticket;
}

void FleetAdmission::Dispatch(uint64_t ticket, AdmitRequest request, Grant grant,
                              TimePoint deadline) {
  std::shared_ptr<Admission> chosen;
  std::string node;
  uint64_t dispatch = 0;
  std::optional<Status> refused;
  {
    MutexLock lock(mu_);
    const TimePoint now = clock_.Now();
    if (request.replay && request.failed && !request.failed->node.empty()) {
      auto it = nodes_.find(request.failed->node);
      if (it != nodes_.end()) it->second.suspect_until = now + suspect_for_;
    }
    std::optional<std::string> pick = PickNode(request, now);
    if (pick) {
      node = *pick;
      chosen = nodes_[node].admission;
      dispatch = next_dispatch_++;
      tickets_[ticket] = {.node = node, .inner = 0, .dispatch = dispatch};
    } else if (viewed_ && !request.model.empty() && !KnownModel(request.model)) {
      refused = NotFound("no node of the fleet serves the model '" + request.model + "'");
    } else if (viewed_ && OutOfServiceLocked(request.model)) {
      refused = OutOfServiceError(request.model);
    } else if (now >= deadline) {
      refused = DeadlineExceeded("no node of the fleet could take the request within " +
                                 std::to_string(options_.max_queue_wait.count()) + " ms");
    } else if (!request.replay && queue_.size() >= options_.max_queue) {
      refused = ResourceExhausted("the router's queue is full (" +
                                  std::to_string(options_.max_queue) + " requests)");
    } else {
      tickets_[ticket] = {};
      queue_.push_back(
          {.ticket = ticket, .request = request, .grant = std::move(grant), .deadline = deadline});
      return;
    }
  }
  if (refused) return grant(std::move(*refused));
  const bool here = request.failed && request.failed->node == node;
  const uint64_t inner = chosen->Request(request.replay, here ? request.failed : std::nullopt,
                                         Wrap(ticket, request, std::move(grant), deadline));
  MutexLock lock(mu_);
  auto it = tickets_.find(ticket);
  if (it != tickets_.end() && it->second.dispatch == dispatch) it->second.inner = inner;
}

Admitter::Grant FleetAdmission::Wrap(uint64_t ticket, AdmitRequest request, Grant grant,
                                     TimePoint deadline) {
  return [this, ticket, request = std::move(request), grant = std::move(grant),
          deadline](Result<Target> result) mutable {
    bool again = false;
    {
      MutexLock lock(mu_);
      auto it = tickets_.find(ticket);
      if (it != tickets_.end()) {
        auto node = nodes_.find(it->second.node);
        // A waiter of a node that left (Admission::Evict) or was drained (out of service): not
        // an answer, another node's turn.
        const StatusCode code = result.ok() ? StatusCode::kOk : result.status().code();
        again = code == StatusCode::kFailedPrecondition ||
                (code == StatusCode::kUnavailable && node != nodes_.end() && !node->second.listed);
        if (!again) tickets_.erase(it);
      }
    }
    if (again) return Dispatch(ticket, std::move(request), std::move(grant), deadline);
    grant(std::move(result));
  };
}

std::optional<std::string> FleetAdmission::PickNode(const AdmitRequest& request, TimePoint now) {
  struct Choice {
    const std::string* name;
    size_t in_flight;
    double load;
    bool suspect;
    bool failed_here;
  };
  std::vector<Choice> choices;
  for (const auto& [name, node] : nodes_) {
    if (!node.listed || (!request.model.empty() && node.model != request.model)) continue;
    if (IsOutOfService(node.routes) || !node.admission->Primary()) continue;
    choices.push_back({&name, node.admission->in_flight(), node.load, now < node.suspect_until,
                       request.failed && request.failed->node == name});
  }
  if (choices.empty()) return std::nullopt;
  // Passed over while another is there: the node the replay failed on, then suspect nodes.
  auto drop = [&](auto pred) {
    if (std::any_of(choices.begin(), choices.end(), [&](const Choice& c) { return !pred(c); })) {
      std::erase_if(choices, pred);
    }
  };
  drop([](const Choice& c) { return c.failed_here; });
  drop([](const Choice& c) { return c.suspect; });
  size_t least = choices.front().in_flight;
  for (const Choice& c : choices) least = std::min(least, c.in_flight);
  std::erase_if(choices, [least](const Choice& c) { return c.in_flight != least; });
  double lightest = choices.front().load;
  for (const Choice& c : choices) lightest = std::min(lightest, c.load);
  std::erase_if(choices, [lightest](const Choice& c) { return c.load > lightest + kLoadBand; });
  return *choices[turn_++ % choices.size()].name;
}

bool FleetAdmission::KnownModel(const std::string& model) const {
  return std::any_of(nodes_.begin(), nodes_.end(),
                     [&](const auto& n) { return n.second.model == model; });
}

bool FleetAdmission::OutOfService(const std::string& model) const {
  MutexLock lock(mu_);
  return OutOfServiceLocked(model);
}

bool FleetAdmission::OutOfServiceLocked(const std::string& model) const {
  bool serving = false;
  for (const auto& [name, node] : nodes_) {
    if (!node.listed || (!model.empty() && node.model != model)) continue;
    if (!IsOutOfService(node.routes)) return false;
    serving = true;
  }
  return serving;
}

Status FleetAdmission::OutOfServiceError(const std::string& model) const {
  return FailedPrecondition(
      "the service was taken out of service by its operator: every node serving " +
      (model.empty() ? std::string("it") : "the model '" + model + "'") +
      " is drained (batonctl drain); none serves until batonctl resume");
}

std::shared_ptr<Admission> FleetAdmission::AdmissionOf(const std::string& node) const {
  MutexLock lock(mu_);
  auto it = nodes_.find(node);
  return it == nodes_.end() ? nullptr : it->second.admission;
}

void FleetAdmission::Cancel(uint64_t ticket) {
  std::shared_ptr<Admission> inner;
  uint64_t inner_ticket = 0;
  Grant queued;
  {
    MutexLock lock(mu_);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return;
    if (it->second.node.empty()) {
      auto w = std::find_if(queue_.begin(), queue_.end(),
                            [ticket](const Waiter& q) { return q.ticket == ticket; });
      if (w != queue_.end()) {
        queued = std::move(w->grant);
        queue_.erase(w);
      }
    } else {
      auto n = nodes_.find(it->second.node);
      if (n != nodes_.end()) inner = n->second.admission;
      inner_ticket = it->second.inner;
    }
    tickets_.erase(it);
  }
  if (queued) return queued(Unavailable("the client went away while queued"));
  if (inner && inner_ticket != 0) inner->Cancel(inner_ticket);
}

void FleetAdmission::Release(const Target& target) {
  if (auto a = AdmissionOf(target.node)) a->Release(target);
}

void FleetAdmission::Unreachable(const Target& target) {
  if (auto a = AdmissionOf(target.node)) a->Unreachable(target);
}

bool FleetAdmission::IsCanary(const Target& target) const {
  auto a = AdmissionOf(target.node);
  return a && a->IsCanary(target);
}

std::optional<Target> FleetAdmission::PrimaryFor(const Target& canary) const {
  auto a = AdmissionOf(canary.node);
  return a ? a->Primary() : std::nullopt;
}

uint64_t FleetAdmission::WatchLoss(const Target& target, std::function<void()> lost) {
  {
    MutexLock lock(mu_);
    auto it = nodes_.find(target.node);
    if (it != nodes_.end() && it->second.listed) {
      const uint64_t id = next_watch_++;
      watches_[id] = {.node = target.node, .lost = std::move(lost)};
      return id;
    }
  }
  lost();  // it left before the watch began
  return 0;
}

void FleetAdmission::Unwatch(uint64_t watch) {
  MutexLock lock(mu_);
  watches_.erase(watch);
}

int FleetAdmission::RetryAfterSeconds() const {
  const auto ms = options_.max_queue_wait.count();
  return static_cast<int>(std::max<int64_t>(1, (ms + 999) / 1000));
}

void FleetAdmission::Tick() {
  std::vector<std::shared_ptr<Admission>> all;
  {
    MutexLock lock(mu_);
    for (const auto& [name, node] : nodes_) all.push_back(node.admission);
  }
  for (auto& a : all) a->Tick();
  DrainQueue();
}

size_t FleetAdmission::Forget(TimePoint now, Duration retention) {
  MutexLock lock(mu_);
  size_t forgotten = 0;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const Node& node = it->second;
    if (node.listed || now - node.left_at < retention || node.admission->in_flight() != 0 ||
        node.admission->queued() != 0 || Referenced(it->first)) {
      ++it;
      continue;
    }
    BATON_LOG(INFO, "router")
        << "fleet node " << it->first << " (model " << node.model << ") forgotten: unlisted for "
        << std::chrono::duration_cast<std::chrono::milliseconds>(now - node.left_at).count()
        << " ms with nothing in flight";
    forgotten_failovers_ += node.admission->failovers();
    it = nodes_.erase(it);
    ++forgotten;
  }
  return forgotten;
}

bool FleetAdmission::Referenced(const std::string& node) const {
  auto names = [&node](const auto& entry) { return entry.second.node == node; };
  return std::any_of(tickets_.begin(), tickets_.end(), names) ||
         std::any_of(watches_.begin(), watches_.end(), names);
}

void FleetAdmission::DrainQueue() {
  std::vector<Waiter> go;
  std::vector<std::pair<Grant, Status>> refused;
  {
    MutexLock lock(mu_);
    const TimePoint now = clock_.Now();
    for (auto it = queue_.begin(); it != queue_.end();) {
      std::optional<Status> refusal;
      if (now >= it->deadline) {
        refusal = DeadlineExceeded("no node of the fleet could take the request within " +
                                   std::to_string(options_.max_queue_wait.count()) + " ms");
      } else if (OutOfServiceLocked(it->request.model)) {
        refusal = OutOfServiceError(it->request.model);
      }
      if (refusal) {
        refused.emplace_back(std::move(it->grant), std::move(*refusal));
        tickets_.erase(it->ticket);
        it = queue_.erase(it);
      } else if (PickNode(it->request, now)) {
        go.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [grant, status] : refused) grant(std::move(status));
  for (Waiter& w : go) Dispatch(w.ticket, std::move(w.request), std::move(w.grant), w.deadline);
}

std::vector<FleetNodeView> FleetAdmission::Nodes() const {
  MutexLock lock(mu_);
  const TimePoint now = clock_.Now();
  std::vector<FleetNodeView> out;
  for (const auto& [name, node] : nodes_) {
    out.push_back({.name = name,
                   .model = node.model,
                   .listed = node.listed,
                   .suspect = now < node.suspect_until,
                   .out_of_service = IsOutOfService(node.routes),
                   .primary = node.admission->Primary(),
                   .in_flight = node.admission->in_flight(),
                   .queued = node.admission->queued(),
                   .load = node.load});
  }
  return out;
}

std::optional<Target> FleetAdmission::AnyPrimary() const {
  for (const FleetNodeView& n : Nodes()) {
    if (n.listed && n.primary) return n.primary;
  }
  return std::nullopt;
}

size_t FleetAdmission::queued() const {
  size_t total = 0;
  for (const FleetNodeView& n : Nodes()) total += n.queued;
  MutexLock lock(mu_);
  return total + queue_.size();
}

size_t FleetAdmission::in_flight() const {
  size_t total = 0;
  for (const FleetNodeView& n : Nodes()) total += n.in_flight;
  return total;
}

uint64_t FleetAdmission::failovers() const {
  MutexLock lock(mu_);
  uint64_t total = forgotten_failovers_;
  for (const auto& [name, node] : nodes_) total += node.admission->failovers();
  return total;
}

std::vector<TargetWeight> FleetAdmission::Weights() const {
  MutexLock lock(mu_);
  std::vector<TargetWeight> out;
  for (const auto& [name, node] : nodes_) {
    if (!node.listed) continue;
    for (TargetWeight& w : node.admission->Weights()) out.push_back(std::move(w));
  }
  return out;
}

}  // namespace baton
