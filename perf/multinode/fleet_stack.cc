#include "perf/multinode/fleet_stack.h"

#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/clock.h"
#include "perf/load/load_client.h"
#include "tests/fleet/etcd_cluster.h"

namespace baton::perf {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kPrefix[] = "/baton-perf/";

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// Router /health's fleet entry for `node`; null when absent or unreadable.
json FleetEntry(const std::string& router, const std::string& node) {
  LoadClient client(router, milliseconds(2000));
  const LoadReply r = client.Get("/health");
  const json health = json::parse(r.body, nullptr, false);
  if (!health.is_object() || !health.contains("fleet")) return nullptr;
  for (const json& n : health["fleet"].value("nodes", json::array())) {
    if (n.value("node", "") == node) return n;
  }
  return nullptr;
}

}  // namespace

FleetStack::~FleetStack() {
  for (ControllerPair& node : nodes_) {
    if (node.pid() > 0) ::kill(node.pid(), SIGCONT);  // a run that failed in a partition
    node.Stop();
  }
}

std::string FleetStack::NodeName(int i) {
  return std::string("node-") + static_cast<char>('a' + i);
}

Result<std::unique_ptr<FleetStack>> FleetStack::Start(const FleetStackOptions& options) {
  if (!fleet_test::EtcdCluster::Installed()) {
    return FailedPrecondition(std::string(fleet_test::kEtcdBinary) +
                              " is missing (scripts/install-deps installs etcd-server)");
  }
  std::unique_ptr<FleetStack> stack(new FleetStack());
  stack->etcd_ = std::make_unique<fleet_test::EtcdCluster>(3);
  if (!stack->etcd_->WaitHealthy()) {
    return Unavailable("etcd did not come up; logs in " + stack->etcd_->dir());
  }
  BATON_RETURN_IF_ERROR(stack->StartNodes(options));
  BATON_RETURN_IF_ERROR(stack->StartRouters(options));
  for (int i = 0; i < stack->nodes(); ++i) {
    BATON_RETURN_IF_ERROR(stack->WaitListed(i, true, milliseconds(30000)));
  }
  return stack;
}

Status FleetStack::StartNodes(const FleetStackOptions& options) {
  for (int i = 0; i < options.nodes; ++i) {
    const std::string dir = options.work_dir + "/" + NodeName(i);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoStatus("mkdir " + dir, errno);
    }
    PairConfig config{.served_name = options.served_name};
    config.engine_args = {"--host", "127.0.2." + std::to_string(i + 1)};
    config.extra_toml =
        "\n[fleet]\netcd = \"" + Join(etcd_->endpoints()) + "\"\nprefix = \"" + kPrefix +
        "\"\nnode = \"" + NodeName(i) + "\"\nmodel = \"" + options.served_name +
        "\"\nlease_ttl_ms = " + std::to_string(options.lease_ttl_ms) + "\netcd_timeout_ms = 300\n";
    BATON_ASSIGN_OR_RETURN(ControllerPair pair,
                           ControllerPair::Start(options.bin_dir, options.model_dir, dir, config));
    nodes_.push_back(std::move(pair));
    node_dirs_.push_back(dir);
  }
  return OkStatus();
}

Status FleetStack::StartRouters(const FleetStackOptions& options) {
  for (int r = 0; r < options.routers; ++r) {
    const std::string name = "router-" + std::to_string(r);
    BATON_ASSIGN_OR_RETURN(
        ServingProcess router,
        StartRouterProcess(options.bin_dir,
                           {"--etcd", Join(etcd_->endpoints()), "--etcd-prefix", kPrefix,
                            "--etcd-timeout-ms", "300", "--fleet-router-name", name},
                           options.work_dir + "/" + name + ".log"));
    router_addresses_.push_back(router.address);
    routers_.push_back(std::move(router));
  }
  return OkStatus();
}

Result<std::vector<pid_t>> FleetStack::NodePids(int i) {
  BATON_ASSIGN_OR_RETURN(json status, nodes_[i].Ctl({"status"}));
  std::vector<pid_t> pids = {nodes_[i].pid()};
  for (const json& e : status.value("engines", json::array())) {
    if (e.value("pid", 0) > 0) pids.push_back(e.value("pid", 0));
  }
  std::ifstream keeper(node_dirs_[i] + "/keeper.sock.pid");
  pid_t keeper_pid = 0;
  if (keeper >> keeper_pid && keeper_pid > 0) pids.push_back(keeper_pid);
  return pids;
}

Status FleetStack::KillNode(int i) {
  BATON_ASSIGN_OR_RETURN(std::vector<pid_t> pids, NodePids(i));
  for (pid_t p : pids) ::kill(p, SIGKILL);
  nodes_[i].Kill();  // reaps the controller
  return OkStatus();
}

Status FleetStack::RestartNode(int i) {
  BATON_RETURN_IF_ERROR(nodes_[i].Respawn());
  return nodes_[i].WaitReady(milliseconds(120000)).status();
}

Status FleetStack::WaitListed(int i, bool listed, milliseconds limit) const {
  const auto deadline = RealClock::Get().Now() + limit;
  for (const std::string& router : router_addresses_) {
    json entry;
    while (true) {
      entry = FleetEntry(router, NodeName(i));
      const bool up =
          entry.is_object() && entry.value("listed", false) && !entry.value("primary", "").empty();
      const bool gone = entry.is_object() && !entry.value("listed", true);
      if (listed ? up : gone) break;
      if (RealClock::Get().Now() > deadline) {
        return DeadlineExceeded("router " + router + " never showed " + NodeName(i) +
                                (listed ? " listed" : " gone") + " (last: " + entry.dump() + ")");
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  return OkStatus();
}

}  // namespace baton::perf
