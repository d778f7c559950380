// RouteSubscriber: keeps the router's copy of the controller's route table.
//
// A thread of its own connects to the controller's Unix socket, says Hello with role
// "router", sends Subscribe and stores every RouteTable it receives. When the controller goes
// away the last table is kept and the thread reconnects with a doubling backoff (50 ms up to
// `max_backoff`). A router with a static backend uses SetStatic() and starts no thread.
//
// Reports: when the agreed protocol version has RouterReport (proto::kProtocolVersionRouterReport)
// and OnReport() gave a source, the thread sends a RouterReport right after Subscribe and then
// every kReportInterval, its `seq` rising across subscriptions. A failed send ends the
// subscription as a failed receive does (reconnect with backoff). A report past the frame
// limit (proto::kDefaultMaxFrameSize: about 18700 engines) is not sent, with one log line, and
// the subscription goes on: its route tables matter more than the outcomes, which the router
// prunes (EngineOutcomes) so that this does not happen.
//
// Ownership: owns its thread and the channel (which lives on that thread). Thread: Primary(),
// table(), connected() and reports_sent() are safe from any thread; Stop() joins. The
// OnChange and OnReport callbacks run on the subscription thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "proto/messages.h"

namespace baton {
namespace proto {
class Channel;
}  // namespace proto

class RouteSubscriber {
 public:
  // Pacing only, on the steady clock (no logic depends on it).
  static constexpr std::chrono::milliseconds kReportInterval{250};

  RouteSubscriber();
  ~RouteSubscriber() { Stop(); }
  RouteSubscriber(const RouteSubscriber&) = delete;
  RouteSubscriber& operator=(const RouteSubscriber&) = delete;

  // Called with every table stored (static or received), on the storing thread. Set it
  // before SetStatic()/Start().
  void OnChange(std::function<void(const proto::RouteTable&)> fn) { on_change_ = std::move(fn); }
  // The engines' outcomes for each RouterReport (see above). Set it before Start().
  void OnReport(std::function<std::vector<proto::EngineOutcome>()> fn) {
    on_report_ = std::move(fn);
  }
  // The engines this router finds stalled, sent as EngineStalled (one per engine) with each
  // report where the agreed protocol has it (proto::kProtocolVersionEngineStalled). Set it
  // before Start().
  void OnStall(std::function<std::vector<proto::EngineStalled>()> fn) { on_stall_ = std::move(fn); }
  // Called (on the subscription thread) when a subscription finds another controller
  // process than the last one did: a restarted controller, whose engines are new. Set it
  // before Start().
  void OnNewController(std::function<void()> fn) { on_new_controller_ = std::move(fn); }
  // A fixed table with one ready primary at `address`.
  void SetStatic(const std::string& address);
  // Starts the subscription thread.
  void Start(std::string socket_path, std::chrono::milliseconds max_backoff);
  void Stop();

  // The ready primary's HTTP address, if the table has one.
  std::optional<std::string> Primary() const;
  proto::RouteTable table() const;
  bool connected() const { return connected_.load(); }
  // RouterReports sent, over every subscription.
  uint64_t reports_sent() const { return report_seq_.load(); }

 private:
  void Run();
  void Subscribe();
  // Sleeps up to `d`; false once Stop() was called.
  bool Wait(std::chrono::milliseconds d);
  void Store(proto::RouteTable table);
  // Sends a RouterReport, and the stalls when `stalls`; false when the connection failed.
  bool SendReport(proto::Channel& channel, bool stalls);

  std::string socket_path_;
  std::chrono::milliseconds max_backoff_{2000};
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ BATON_GUARDED_BY(mu_) = false;
  proto::RouteTable table_ BATON_GUARDED_BY(mu_);
  std::atomic<bool> connected_{false};
  // The subscriber thread's: "controller unreachable" was logged at WARN since the last
  // subscription (the next failures go to DEBUG).
  bool unreachable_logged_ = false;
  std::function<void(const proto::RouteTable&)> on_change_;
  std::function<std::vector<proto::EngineOutcome>()> on_report_;
  std::function<std::vector<proto::EngineStalled>()> on_stall_;
  std::function<void()> on_new_controller_;
  pid_t controller_pid_ = 0;  // the controller of the last subscription (subscription thread)
  std::atomic<uint64_t> report_seq_{0};  // the last RouterReport's seq
  // The last table's log line (the subscriber thread's): a table sent again on a new
  // connection (at Hello and in answer to Subscribe) is not logged twice.
  std::string last_table_line_;
  bool oversize_logged_ = false;  // a report past the frame limit was logged (subscriber thread)
  std::thread thread_;
  const std::string instance_;  // this router's name in its RouterReports: random hex
};

}  // namespace baton
