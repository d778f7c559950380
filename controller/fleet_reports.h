// FleetReportReader: brings the reports of the fleet's routers to this node's controller
// (docs/fleet.md, Routers). A router that follows the fleet through etcd does not subscribe
// to this controller's socket; it writes what it saw of this node's engines under
// <prefix>reports/<node>/<router> (fleet/fleet_records.h). This reader reads that prefix every
// `every` and hands each report that parses, and changed (a new mod_revision), to `deliver`
// with the stalls it carries (each with `router` set to the report's), which the controller
// stores as it stores a RouterReport from its socket (RoutePublisher::StoreFleetReport), so the
// canary judge counts the traffic of every router, and judges each stall as an EngineStalled
// from its socket (Controller::OnEngineStalled). A router writes its report again every
// report interval while a stall lasts, so a stall is delivered as often; the stalls of a key
// at its first read are not (it may be the last report of a router that died, read by a
// controller that just started, and a live router's comes again). A dead router's last
// report is delivered once and expires with its lease. A report that does not parse is
// skipped with one log line per version, stalls that do not parse are left out of the report
// they came in; etcd not answering changes nothing (the last reports stay). A key is
// remembered only while it is listed: a router's name per process (host-pid) does not make a
// long-lived controller keep a key for every router that ever ran.
//
// Ownership: owns its EtcdClient and thread. Thread: `deliver` runs on the reader's thread
// (the controller posts it to its io thread); the destructor stops the thread and joins it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "fleet/etcd_client.h"
#include "proto/messages.h"

namespace baton {

class FleetReportReader {
 public:
  FleetReportReader(
      std::unique_ptr<EtcdClient> etcd, std::string prefix,
      std::function<void(proto::RouterReport, std::vector<proto::EngineStalled>)> deliver,
      std::chrono::milliseconds every = std::chrono::milliseconds(250));
  ~FleetReportReader();
  FleetReportReader(const FleetReportReader&) = delete;
  FleetReportReader& operator=(const FleetReportReader&) = delete;

  uint64_t delivered() const;
  // The report keys remembered: those of the last reading.
  size_t tracked() const;

 private:
  void Run();
  void ReadOnce();

  std::unique_ptr<EtcdClient> etcd_;
  const std::string prefix_;  // <prefix>reports/<node>/
  const std::function<void(proto::RouterReport, std::vector<proto::EngineStalled>)> deliver_;
  const std::chrono::milliseconds every_;
  // Key -> mod_revision delivered or refused, of the keys of the last reading.
  std::map<std::string, int64_t> seen_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ BATON_GUARDED_BY(mu_) = false;
  uint64_t delivered_ BATON_GUARDED_BY(mu_) = 0;
  size_t tracked_ BATON_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace baton
