#include "router/fleet/fleet_view.h"

#include <algorithm>

#include "base/log.h"

namespace baton {

Result<std::unique_ptr<FleetView>> FleetView::Create(FleetViewOptions options) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Create(options.etcd));
  return std::unique_ptr<FleetView>(new FleetView(std::move(options), std::move(etcd)));
}

FleetView::FleetView(FleetViewOptions options, std::unique_ptr<EtcdClient> etcd)
    : options_(std::move(options)), etcd_(std::move(etcd)) {}

void FleetView::Start() {
  BATON_LOG(INFO, "router") << "following the fleet under " << options_.prefix << " in etcd "
                            << etcd_->endpoint() << " as router " << options_.router;
  thread_ = std::thread([this] { Run(); });
}

void FleetView::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

FleetViewState FleetView::state() const {
  MutexLock lock(mu_);
  return state_;
}

void FleetView::Run() {
  auto next_report = std::chrono::steady_clock::now();
  for (;;) {
    Read();
    if (std::chrono::steady_clock::now() >= next_report) {
      Report();
      next_report = std::chrono::steady_clock::now() + options_.report_every;
    }
    MutexLock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + options_.poll;
    while (!stopping_) {
      if (cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout) break;
    }
    if (stopping_) return;
  }
}

void FleetView::Read() {
  Result<EtcdRange> range = etcd_->GetPrefix(FleetNodesPrefix(options_.prefix));
  if (!range.ok()) return Failed(range.status());
  Answered();
  std::map<std::string, int64_t> seen;
  for (const EtcdKeyValue& kv : range->kvs) seen[kv.key] = kv.mod_revision;
  if (seen == seen_) return;
  seen_ = std::move(seen);
  std::vector<FleetNode> nodes;
  for (const EtcdKeyValue& kv : range->kvs) {
    Result<FleetNode> node = ParseNodeRecord(kv.key, kv.value);
    if (node.ok()) {
      nodes.push_back(std::move(*node));
    } else if (refused_.First(kv.key, kv.mod_revision)) {
      BATON_LOG(WARN, "router") << "fleet record left out: " << node.status().message();
    }
  }
  refused_.EndReading();
  {
    MutexLock lock(mu_);
    state_.nodes = nodes.size();
  }
  if (on_change_) on_change_(nodes);
}

void FleetView::Report() {
  if (!on_report_) return;
  const auto now = std::chrono::steady_clock::now();
  if (lease_ != 0 && now - lease_renewed_ >= options_.report_ttl / 3) {
    Result<int64_t> left = etcd_->KeepAlive(lease_);
    if (!left.ok() && left.status().code() != StatusCode::kNotFound) return Failed(left.status());
    if (left.ok()) lease_renewed_ = now;
    if (!left.ok()) {  // expired: every report is written again under a new lease
      lease_ = 0;
      written_.clear();
    }
  }
  if (lease_ == 0) {
    const auto ttl =
        std::max(std::chrono::seconds(1),
                 std::chrono::duration_cast<std::chrono::seconds>(options_.report_ttl));
    Result<int64_t> lease = etcd_->GrantLease(ttl);
    if (!lease.ok()) return Failed(lease.status());
    lease_ = *lease;
    lease_renewed_ = now;
  }
  std::set<std::string> reported;  // written or unchanged
  std::set<std::string> round;     // every key of this round's reports
  for (auto& [node, seen] : on_report_()) {
    if (node.empty()) continue;
    const std::string key = FleetReportKey(options_.prefix, node, options_.router);
    round.insert(key);
    proto::RouterReport report{
        .seq = seq_ + 1, .engines = std::move(seen.engines), .router = options_.router};
    proto::RouterReport unchanged = report;
    unchanged.seq = 0;
    const std::string text = RouterReportJson(unchanged, seen.stalls);
    if (!Fits(key, report.engines.size(), text)) continue;
    reported.insert(key);
    if (written_[key] == text) continue;
    Result<int64_t> put = etcd_->Put(key, RouterReportJson(report, seen.stalls), lease_);
    if (!put.ok() && Stops(key, put.status())) return;
    if (!put.ok()) continue;
    if (denied_.erase(key) != 0) {
      BATON_LOG(INFO, "router") << "the report " << key << " is written again";
    }
    ++seq_;
    written_[key] = text;
    MutexLock lock(mu_);
    ++state_.reports_written;
  }
  std::erase_if(oversize_, [&](const std::string& key) { return round.count(key) == 0; });
  ForgetUnreported(reported);
  std::erase_if(denied_, [&](const auto& d) {
    return round.count(d.first) == 0 && written_.count(d.first) == 0;
  });
}

bool FleetView::Stops(const std::string& key, const Status& status) {
  if (status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kDeadlineExceeded) {
    Failed(status);
    return true;
  }
  {
    MutexLock lock(mu_);
    ++state_.reports_refused;
  }
  std::string& logged = denied_[key];
  if (logged != status.message()) {
    logged = status.message();
    BATON_LOG(WARN, "router") << "etcd refuses the report " << key << ": " << status.message()
                              << " (the other nodes' reports go on)";
  }
  return false;
}

bool FleetView::Fits(const std::string& key, size_t engines, const std::string& text) {
  // The seq written with it adds at most 20 digits.
  if (text.size() + 20 <= options_.max_report_bytes) {
    if (oversize_.erase(key) != 0) {
      BATON_LOG(INFO, "router") << "the report " << key << " fits again: written";
    }
    return true;
  }
  if (oversize_.insert(key).second) {
    BATON_LOG(ERROR, "router") << "the report " << key << " of " << engines << " engines is "
                               << text.size() << " bytes, past " << options_.max_report_bytes
                               << ": not written (its node's canaries hold) until pruning "
                               << "makes it fit";
  }
  return false;
}

void FleetView::ForgetUnreported(const std::set<std::string>& reported) {
  for (auto it = written_.begin(); it != written_.end();) {
    if (reported.count(it->first) != 0) {
      ++it;
      continue;
    }
    Result<int64_t> gone = etcd_->Delete(it->first);
    if (!gone.ok() && Stops(it->first, gone.status())) return;
    if (!gone.ok()) {
      ++it;  // tried again next round; its lease ends it otherwise
      continue;
    }
    denied_.erase(it->first);
    it = written_.erase(it);
  }
}

void FleetView::Failed(const Status& status) {
  bool viewed = false;
  {
    MutexLock lock(mu_);
    state_.etcd_connected = false;
    ++state_.failures;
    state_.last_error = status.message();
    viewed = state_.reads > 0;
  }
  if (!down_logged_) {
    down_logged_ = true;
    const bool answered =
        status.code() != StatusCode::kUnavailable && status.code() != StatusCode::kDeadlineExceeded;
    BATON_LOG(WARN, "router") << (answered ? "etcd refuses the router's call ("
                                           : "etcd does not answer (")
                              << status.message() << "): "
                              << (viewed ? "routing on the last view of the fleet"
                                         : "no view of the fleet yet: requests wait in the "
                                           "queue for one");
  }
}

void FleetView::Answered() {
  {
    MutexLock lock(mu_);
    state_.etcd_connected = true;
    ++state_.reads;
    state_.last_error.clear();
  }
  if (down_logged_) {
    down_logged_ = false;
    BATON_LOG(INFO, "router") << "etcd answers again: following the fleet";
  }
}

}  // namespace baton
