// FleetStack: the processes of baton-perf-fleet. A real 3-member etcd cluster on loopback
// (tests/fleet/etcd_cluster.h, Debian's etcd-server), N Baton nodes (each a baton-controller
// with its own work directory and a reference-engine pair whose engines listen on the node's
// own loopback address 127.0.2.N, registered under [fleet] with the given lease TTL), and R
// baton-routers that follow the fleet (`--etcd`). Start returns once every router lists every
// node with a ready primary.
//
// Faults act on every process of a node at once: its controller, its baton-keeper and its
// engines (the pids read just before from `batonctl status` and the keeper's pid file).
//
// Ownership: the stack owns every process and the etcd cluster (killed and reaped when it
// goes). Thread: the driver's main thread; RouterAddresses() may be read from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "perf/load/load_procs.h"

namespace baton::fleet_test {
class EtcdCluster;
}

namespace baton::perf {

struct FleetStackOptions {
  std::string bin_dir = {};
  std::string model_dir = {};
  std::string work_dir = {};
  std::string served_name = "tiny";
  int nodes = 3;
  int routers = 2;
  int lease_ttl_ms = 2000;
};

class FleetStack {
 public:
  static Result<std::unique_ptr<FleetStack>> Start(const FleetStackOptions& options);
  // Stops every node as an operator would (SIGTERM: the controller stops its engines and
  // baton-keeper lets the memory go), then the routers and etcd. A node's SIGKILL alone
  // would leave its engines and keeper running.
  ~FleetStack();
  FleetStack(const FleetStack&) = delete;
  FleetStack& operator=(const FleetStack&) = delete;

  int nodes() const { return static_cast<int>(nodes_.size()); }
  static std::string NodeName(int i);
  // "127.0.0.1:PORT" of each router.
  const std::vector<std::string>& RouterAddresses() const { return router_addresses_; }

  // Every process of node i now: controller, keeper, engines.
  Result<std::vector<pid_t>> NodePids(int i);
  // kill -9 of every process of node i (the controller reaped).
  Status KillNode(int i);
  // A new controller on node i's directory after KillNode; it starts a new pair. Waits for
  // the pair (not for the routers).
  Status RestartNode(int i);
  // Polls every router's /health until node i is listed with a primary (`listed`) or is no
  // longer listed; DeadlineExceeded after `limit`.
  Status WaitListed(int i, bool listed, std::chrono::milliseconds limit) const;

 private:
  FleetStack() = default;
  Status StartNodes(const FleetStackOptions& options);
  Status StartRouters(const FleetStackOptions& options);

  std::unique_ptr<fleet_test::EtcdCluster> etcd_;
  std::vector<ControllerPair> nodes_;
  std::vector<std::string> node_dirs_;
  std::vector<ServingProcess> routers_;
  std::vector<std::string> router_addresses_;
};

}  // namespace baton::perf
