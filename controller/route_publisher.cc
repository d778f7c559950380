#include "controller/route_publisher.h"

#include <algorithm>
#include <set>

#include "base/log.h"

namespace baton {
namespace {

// Adds `e`'s counters to sum[e.engine_id].
void AddTo(std::map<uint64_t, proto::EngineOutcome>* sum, const proto::EngineOutcome& e) {
  proto::EngineOutcome& s = (*sum)[e.engine_id];
  s.engine_id = e.engine_id;
  s.requests += e.requests;
  s.errors += e.errors;
  s.duration_ms += e.duration_ms;
  s.succeeded += e.succeeded;
  s.compared += e.compared;
  s.disagreed += e.disagreed;
}

bool SameRoutes(const proto::RouteTable& a, const proto::RouteTable& b) {
  return a.epoch == b.epoch && a.pair_state == b.pair_state && a.entries == b.entries;
}

}  // namespace

void RoutePublisher::AddSubscriber(std::unique_ptr<proto::Channel> channel,
                                   const std::string& name) {
  const uint64_t id = next_id_++;
  subscribers_[id] = Subscriber{.channel = std::move(channel), .name = name};
  BATON_LOG(INFO, "routes") << "subscriber " << name << " added (" << subscribers_.size()
                            << " now)";
  // Before the first table (a restarted controller re-adopting its engines) the router keeps
  // the table it has.
  if (published_) SendTo(id);
  Watch(id);
}

bool RoutePublisher::Publish(proto::RouteTable table) {
  if (published_ && SameRoutes(table, current_)) return false;
  table.version = current_.version + 1;
  current_ = std::move(table);
  published_ = true;
  std::string summary;
  for (const proto::RouteEntry& e : current_.entries) {
    summary += " engine " + std::to_string(e.engine_id) + "=" + proto::ToString(e.role) +
               (e.ready ? "(ready)" : "");
  }
  BATON_LOG(INFO, "routes") << "route table v" << current_.version << " epoch " << current_.epoch
                            << " pair " << current_.pair_state << ":"
                            << (summary.empty() ? " no engines" : summary);
  std::vector<uint64_t> ids;
  for (const auto& [id, sub] : subscribers_) ids.push_back(id);
  for (uint64_t id : ids) SendTo(id);
  return true;
}

std::map<uint64_t, proto::EngineOutcome> RoutePublisher::Outcomes() const {
  std::map<uint64_t, proto::EngineOutcome> sum;
  for (const auto& [router, report] : reports_) {
    for (const proto::EngineOutcome& e : report.engines) AddTo(&sum, e);
  }
  return sum;
}

void RoutePublisher::SendTo(uint64_t id) {
  auto it = subscribers_.find(id);
  if (it == subscribers_.end() || !published_) return;
  Status sent = it->second.channel->Send(current_);
  if (!sent.ok()) {
    BATON_LOG(WARN, "routes") << "dropping subscriber " << it->second.name << ": "
                              << sent.ToString();
    Drop(it);
  }
}

void RoutePublisher::Drop(SubscriberMap::iterator it) { subscribers_.erase(it); }

void RoutePublisher::StoreFleetReport(proto::RouterReport report) {
  report.router = "fleet " + report.router;
  Store(0, std::move(report), /*fleet=*/true);
}

void RoutePublisher::Store(uint64_t id, proto::RouterReport report, bool fleet) {
  const std::string key =
      report.router.empty() ? "connection " + std::to_string(id) : "router " + report.router;
  Report& kept = reports_[key];
  if (clock_ != nullptr) {
    for (const proto::EngineOutcome& o : report.engines) {
      auto before =
          std::find_if(kept.engines.begin(), kept.engines.end(),
                       [&o](const proto::EngineOutcome& k) { return k.engine_id == o.engine_id; });
      if (before != kept.engines.end() && o.succeeded > before->succeeded) {
        last_success_[o.engine_id] = clock_->Now();
      }
    }
  }
  if (kept.fleet) --fleet_reports_;
  kept = Report{std::move(report.engines), ++heard_, fleet};
  if (fleet) ++fleet_reports_;
  while (reports_.size() > kMaxRouters) {
    auto oldest = reports_.begin();
    for (auto it = reports_.begin(); it != reports_.end(); ++it) {
      if (it->second.heard < oldest->second.heard) oldest = it;
    }
    if (oldest->second.fleet) --fleet_reports_;
    reports_.erase(oldest);
  }
  ForgetUnreported();
}

void RoutePublisher::ForgetUnreported() {
  std::set<uint64_t> reported;
  for (const auto& [name, kept] : reports_) {
    for (const proto::EngineOutcome& o : kept.engines) reported.insert(o.engine_id);
  }
  std::erase_if(last_success_, [&reported](const auto& e) { return !reported.contains(e.first); });
}

std::optional<TimePoint> RoutePublisher::LastSuccess(uint64_t engine) const {
  auto it = last_success_.find(engine);
  if (it == last_success_.end()) return std::nullopt;
  return it->second;
}

void RoutePublisher::Refuse(SubscriberMap::iterator it, const std::string& why) {
  // Told why, then closed: a peer that keeps sending without reading would otherwise hold the
  // controller's thread for send_timeout per reply.
  BATON_LOG(WARN, "routes") << "dropping subscriber " << it->second.name << ": " << why;
  (void)it->second.channel->Send(proto::ErrorMsg::FromStatus(FailedPrecondition(why)));
  Drop(it);
}

void RoutePublisher::Watch(uint64_t id) {
  auto it = subscribers_.find(id);
  if (it == subscribers_.end()) return;
  it->second.channel->AsyncReceive([this, id](Result<proto::ReceivedMessage> msg) {
    auto sub = subscribers_.find(id);
    if (sub == subscribers_.end()) return;
    if (!msg.ok()) {
      BATON_LOG(INFO, "routes") << "subscriber " << sub->second.name
                                << " left: " << msg.status().message();
      Drop(sub);
      return;
    }
    if (msg->type == proto::MsgType::kRouterReport) {
      Result<proto::RouterReport> report = msg->As<proto::RouterReport>();
      if (!report.ok()) return Refuse(sub, "bad RouterReport: " + report.status().message());
      Store(id, std::move(report).value());
    } else if (msg->type == proto::MsgType::kEngineStalled) {
      Result<proto::EngineStalled> stalled = msg->As<proto::EngineStalled>();
      if (!stalled.ok()) return Refuse(sub, "bad EngineStalled: " + stalled.status().message());
      if (on_stalled_) on_stalled_(*stalled);
      if (subscribers_.count(id) == 0) return;  // the callback may publish, and drop it
    } else if (msg->type == proto::MsgType::kSubscribe) {
      if (published_) SendTo(id);  // a repeated Subscribe asks for the current table again
    } else {
      return Refuse(sub,
                    "a router connection only sends Subscribe, RouterReport and EngineStalled, "
                    "not " +
                        proto::MsgTypeName(msg->type));
    }
    if (subscribers_.count(id) != 0) Watch(id);
  });
}

}  // namespace baton
