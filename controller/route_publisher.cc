#include "controller/route_publisher.h"

#include "base/log.h"

namespace baton {
namespace {

bool SameRoutes(const proto::RouteTable& a, const proto::RouteTable& b) {
  return a.epoch == b.epoch && a.pair_state == b.pair_state && a.entries == b.entries;
}

}  // namespace

void RoutePublisher::AddSubscriber(std::unique_ptr<proto::Channel> channel,
                                   const std::string& name) {
  const uint64_t id = next_id_++;
  subscribers_[id] = Subscriber{std::move(channel), name};
  BATON_LOG(INFO, "routes") << "subscriber " << name << " added (" << subscribers_.size()
                            << " now)";
  SendTo(id);
  Watch(id);
}

bool RoutePublisher::Publish(proto::RouteTable table) {
  if (published_ && SameRoutes(table, current_)) return false;
  table.version = current_.version + 1;
  current_ = std::move(table);
  published_ = true;
  std::string summary;
  for (const proto::RouteEntry& e : current_.entries) {
    summary += " engine " + std::to_string(e.engine_id) + "=" + e.role + (e.ready ? "(ready)" : "");
  }
  BATON_LOG(INFO, "routes") << "route table v" << current_.version << " epoch " << current_.epoch
                            << " pair " << current_.pair_state << ":"
                            << (summary.empty() ? " no engines" : summary);
  std::vector<uint64_t> ids;
  for (const auto& [id, sub] : subscribers_) ids.push_back(id);
  for (uint64_t id : ids) SendTo(id);
  return true;
}

void RoutePublisher::SendTo(uint64_t id) {
  auto it = subscribers_.find(id);
  if (it == subscribers_.end() || !published_) return;
  Status sent = it->second.channel->Send(current_);
  if (!sent.ok()) {
    BATON_LOG(WARN, "routes") << "dropping subscriber " << it->second.name << ": "
                              << sent.ToString();
    subscribers_.erase(it);
  }
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
      subscribers_.erase(sub);
      return;
    }
    if (msg->type != proto::MsgType::kSubscribe) {
      // Told why, then closed: a peer that keeps sending without reading would otherwise
      // hold the controller's thread for send_timeout per reply.
      const std::string why =
          "a router connection only sends Subscribe, not " + proto::MsgTypeName(msg->type);
      BATON_LOG(WARN, "routes") << "dropping subscriber " << sub->second.name << ": " << why;
      (void)sub->second.channel->Send(proto::ErrorMsg::FromStatus(FailedPrecondition(why)));
      subscribers_.erase(sub);
      return;
    }
    SendTo(id);  // a repeated Subscribe asks for the current table again
    if (subscribers_.count(id) != 0) Watch(id);
  });
}

}  // namespace baton
