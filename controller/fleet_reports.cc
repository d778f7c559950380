#include "controller/fleet_reports.h"

#include <utility>

#include "base/log.h"
#include "fleet/fleet_records.h"

namespace baton {

FleetReportReader::FleetReportReader(
    std::unique_ptr<EtcdClient> etcd, std::string prefix,
    std::function<void(proto::RouterReport, std::vector<proto::EngineStalled>)> deliver,
    std::chrono::milliseconds every)
    : etcd_(std::move(etcd)),
      prefix_(std::move(prefix)),
      deliver_(std::move(deliver)),
      every_(every),
      thread_([this] { Run(); }) {}

FleetReportReader::~FleetReportReader() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

uint64_t FleetReportReader::delivered() const {
  MutexLock lock(mu_);
  return delivered_;
}

size_t FleetReportReader::tracked() const {
  MutexLock lock(mu_);
  return tracked_;
}

void FleetReportReader::Run() {
  for (;;) {
    ReadOnce();
    MutexLock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + every_;
    while (!stopping_) {
      if (cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout) break;
    }
    if (stopping_) return;
  }
}

void FleetReportReader::ReadOnce() {
  Result<EtcdRange> range = etcd_->GetPrefix(prefix_);
  if (!range.ok()) return;  // the registrar logs etcd's absence; the last reports stay
  std::map<std::string, int64_t> before = std::exchange(seen_, {});
  for (const EtcdKeyValue& kv : range->kvs) {
    seen_[kv.key] = kv.mod_revision;
    auto known = before.find(kv.key);
    const bool fresh = known == before.end();
    if (!fresh && known->second == kv.mod_revision) continue;
    Result<proto::RouterReport> report = ParseRouterReport(kv.key, kv.value);
    if (!report.ok()) {
      BATON_LOG(WARN, "fleet") << "router report skipped: " << report.status().message();
      continue;
    }
    // A key first seen may be the last report of a router that died (its lease not run out
    // yet): its stalls are old news, and a live router writes a stall's again within a report
    // interval, as its quiet time grows.
    Result<std::vector<proto::EngineStalled>> stalls =
        fresh ? std::vector<proto::EngineStalled>{} : ParseReportStalls(kv.key, kv.value);
    if (!stalls.ok()) {
      BATON_LOG(WARN, "fleet") << "router report's stalls skipped: " << stalls.status().message();
      stalls = std::vector<proto::EngineStalled>{};
    }
    deliver_(std::move(*report), std::move(*stalls));
    MutexLock lock(mu_);
    ++delivered_;
  }
  MutexLock lock(mu_);
  tracked_ = seen_.size();
}

}  // namespace baton
