#include "controller/ctl/degradations.h"

#include <sstream>

#include "fleet/plaintext_etcd.h"

namespace baton {
namespace {

constexpr uint64_t kHugePage = 2u << 20;

std::string WeightsPagesWhy(const WeightsStatus& w) {
  for (const std::string& warning : w.warnings) {
    if (warning.find("partial huge pages") != std::string::npos) return warning;
  }
  for (const std::string& warning : w.warnings) {
    if (warning.find("huge page") != std::string::npos) return warning;
  }
  return "the weight arena is on normal pages (too few free 2 MiB huge pages: raise "
         "vm.nr_hugepages, docs/operations.md)";
}

std::string LockWhy(const WeightsStatus& w) {
  for (const std::string& warning : w.warnings) {
    if (warning.find("mlock") != std::string::npos) return warning;
  }
  return "the weight arena is not locked in memory (raise LimitMEMLOCK / ulimit -l)";
}

}  // namespace

std::string EnginesOpenWarning(const std::string& host) {
  return "engines listen on " + host +
         " with no [engine] key_file: whoever reaches their ports is served without a router "
         "(docs/operations.md, The engine key)";
}

const std::vector<std::string>& DegradationKinds() {
  static const auto* kinds = new std::vector<std::string>{
      "weights_huge_pages", "weights_mlock",  "pool_huge_pages", "keeper",
      "weights_files",      "etcd_plaintext", "engines_open"};
  return *kinds;
}

std::vector<Degradation> Degradations(const ControllerStatus& c) {
  std::vector<Degradation> out;
  if (c.config == nullptr) return out;
  const ControllerConfig& config = *c.config;
  // A partial arena (some of it on 4 KiB pages) is degraded too.
  if (config.weights_huge_pages && (!c.weights.huge_pages || c.weights.small_bytes > 0)) {
    out.push_back({"weights_huge_pages", WeightsPagesWhy(c.weights)});
  }
  if (config.weights_lock && !c.weights.locked && !c.weights.lock_pending) {
    out.push_back({"weights_mlock", LockWhy(c.weights)});
  }
  if (config.pool_huge_pages && config.block_bytes % kHugePage == 0 && !c.pool.huge_pages) {
    out.push_back({"pool_huge_pages", c.pool.huge_pages_fallback.empty()
                                          ? "the pool is on normal pages"
                                          : c.pool.huge_pages_fallback});
  }
  if (config.keep_memory && c.keeper.state != KeeperState::kKeeping) {
    std::string why = "baton-keeper " + std::string(ToString(c.keeper.state));
    if (!c.keeper.detail.empty()) why += " (" + c.keeper.detail + ")";
    out.push_back({"keeper", why + ": a controller restart now reloads the weights and fences "
                                   "the engines"});
  }
  if (!c.weights.files_differ.empty()) out.push_back({"weights_files", c.weights.files_differ});
  if (std::vector<std::string> plain =
          PlaintextRemoteEndpoints(config.fleet_etcd, !config.fleet_etcd_ca_file.empty());
      !plain.empty()) {
    out.push_back({"etcd_plaintext", PlaintextEtcdWarning(plain)});
  }
  if (config.engine_key_file.empty() && !IsLoopbackHost(config.engine_host)) {
    out.push_back({"engines_open", EnginesOpenWarning(config.engine_host)});
  }
  return out;
}

std::string DegradationMetrics(const ControllerStatus& c) {
  std::ostringstream out;
  const std::vector<Degradation> found = Degradations(c);
  out << "# HELP baton_degraded 1 while the controller runs without something its configuration "
         "asked for (huge pages, mlock, baton-keeper), on weights its model files no longer "
         "hold, with its fleet's etcd in plain HTTP off the host, or with engines open to the "
         "network without a key\n# TYPE baton_degraded gauge\n";
  for (const std::string& kind : DegradationKinds()) {
    bool on = false;
    for (const Degradation& d : found) on = on || d.what == kind;
    out << "baton_degraded{what=\"" << kind << "\"} " << (on ? 1 : 0) << "\n";
  }
  const auto gauge = [&](const char* name, const char* help, bool v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
        << name << " " << (v ? 1 : 0) << "\n";
  };
  gauge("baton_weights_huge_pages", "1 when the weight arena is on 2 MiB huge pages",
        c.weights.huge_pages);
  gauge("baton_weights_locked", "1 when the weight arena is mlocked", c.weights.locked);
  gauge("baton_pool_huge_pages", "1 when the KV-cache pool is on 2 MiB huge pages",
        c.pool.huge_pages);
  gauge("baton_memory_kept",
        "1 while baton-keeper keeps the weights and the pool for the next controller",
        c.keeper.state == KeeperState::kKeeping);
  return out.str();
}

std::string DegradationText(const ControllerStatus& c) {
  std::string out;
  for (const Degradation& d : Degradations(c)) out += "degraded: " + d.what + ": " + d.why + "\n";
  return out;
}

nlohmann::json DegradationJson(const ControllerStatus& c) {
  nlohmann::json out = nlohmann::json::array();
  for (const Degradation& d : Degradations(c)) out.push_back({{"what", d.what}, {"why", d.why}});
  return out;
}

}  // namespace baton
