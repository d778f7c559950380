// FleetView: a router's view of the fleet in etcd (docs/fleet.md, Routers), and its reports
// to the fleet's controllers.
//
// A thread of its own reads every node record under <prefix>nodes/ every `poll` (one range
// request per 500 nodes, at one revision: EtcdClient::GetPrefix), and calls OnChange with every
// node whose record parses when the set of records changed (a key added, rewritten or gone). A
// record that does not parse is left out, with one log line per version of it. When etcd cannot be
// reached the last view is kept and nothing else changes: a router keeps serving the nodes it knew;
// one line is logged when etcd stops answering and one when it answers again.
//
// Every `report_every`, what this router saw of each node's engines (OnReport: outcomes and
// stalls) is written under <prefix>reports/<node>/<router> (fleet/fleet_records.h) when it
// changed (a stall's quiet time grows: a stalled node's report is written every
// `report_every` while the stall lasts, and no more often), under a
// lease of this router (`report_ttl`, renewed every third of it and granted again when
// lost), so a node's controller judges its canaries on the traffic of every router and a
// gone router's reports expire. A node OnReport no longer lists (its engines were all
// forgotten, EngineOutcomes) has its report deleted. A report larger than `max_report_bytes`
// (below etcd's request limit, 1.5 MiB by default) is not written and its earlier one is
// deleted, with one ERROR line until it fits again (pruning shrinks it): the node's canaries
// hold meanwhile, and the other nodes' reports are written as usual. A report etcd answers
// with a refusal (its access control denies the key, a quota) is left as it was, with one
// WARN line per key and reason and a count (reports_refused); the other nodes' reports are
// written. Only an etcd that does not answer stops the round ("etcd does not answer").
//
// Ownership: owns its EtcdClient and thread. Thread: the callbacks run on the view's thread;
// the accessors are safe from any thread; Stop() joins.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "fleet/etcd_client.h"
#include "fleet/fleet_records.h"
#include "fleet/logged_keys.h"
#include "proto/messages.h"

namespace baton {

struct FleetViewOptions {
  EtcdOptions etcd;
  std::string prefix = "/baton/";
  std::chrono::milliseconds poll{100};
  std::chrono::milliseconds report_every{250};
  std::chrono::milliseconds report_ttl{10000};
  std::string router;  // this router's name in its report keys
  size_t max_report_bytes = 1 << 20;
};

struct FleetViewState {
  bool etcd_connected = false;  // the last read answered
  size_t nodes = 0;             // in the last view
  uint64_t reads = 0;           // range requests that answered
  uint64_t failures = 0;        // calls to etcd that failed
  uint64_t reports_written = 0;
  uint64_t reports_refused = 0;  // writes or deletions of a report etcd refused
  std::string last_error;
};

class FleetView {
 public:
  // What this router saw of one node's engines: its outcomes and the engines it finds
  // stalled (Router::Stalls).
  struct NodeReport {
    std::vector<proto::EngineOutcome> engines;
    std::vector<proto::EngineStalled> stalls;
  };
  using Reports = std::map<std::string, NodeReport>;  // by node

  static Result<std::unique_ptr<FleetView>> Create(FleetViewOptions options);
  ~FleetView() { Stop(); }
  FleetView(const FleetView&) = delete;
  FleetView& operator=(const FleetView&) = delete;

  // Set both before Start().
  void OnChange(std::function<void(const std::vector<FleetNode>&)> fn) {
    on_change_ = std::move(fn);
  }
  void OnReport(std::function<Reports()> fn) { on_report_ = std::move(fn); }
  void Start();
  void Stop();

  FleetViewState state() const;

 private:
  FleetView(FleetViewOptions options, std::unique_ptr<EtcdClient> etcd);
  void Run();
  // Reads the nodes; calls OnChange when the records changed.
  void Read();
  // Writes the reports that changed (and keeps the lease).
  void Report();
  // Whether the report `text` for `key` is within max_report_bytes (logs once when not).
  bool Fits(const std::string& key, size_t engines, const std::string& text);
  // Deletes the reports written earlier whose key is not in `reported`.
  void ForgetUnreported(const std::set<std::string>& reported);
  // Whether `status` of a call about report `key` stops the round: etcd did not answer
  // (Failed). A refusal is logged (once per key and reason) and counted, and the round goes on.
  bool Stops(const std::string& key, const Status& status);
  void Failed(const Status& status);
  void Answered();

  const FleetViewOptions options_;
  std::unique_ptr<EtcdClient> etcd_;
  std::function<void(const std::vector<FleetNode>&)> on_change_;
  std::function<Reports()> on_report_;
  // View thread only.
  std::map<std::string, int64_t> seen_;         // key -> mod_revision of the last view
  LoggedKeys refused_;                          // node records logged as not parsing
  std::map<std::string, std::string> written_;  // report key -> the value written last
  std::set<std::string> oversize_;              // report keys logged as too large, reported now
  std::map<std::string, std::string> denied_;   // report key -> etcd's refusal logged
  int64_t lease_ = 0;
  std::chrono::steady_clock::time_point lease_renewed_;
  uint64_t seq_ = 0;
  bool down_logged_ = false;  // "etcd does not answer" was logged, "answers again" not yet
  // Shared.
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ BATON_GUARDED_BY(mu_) = false;
  FleetViewState state_ BATON_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace baton
