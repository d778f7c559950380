// Support for tests/deploy: running a program and capturing what it prints, plain HTTP GETs to
// any loopback address, and a real Prometheus (Debian's /usr/bin/prometheus) on its own
// loopback address with its own data directory, stopped (SIGTERM, then SIGKILL) and removed
// when the object goes, on every exit path of a test.
//
// Header-only test support (the test build compiles *_test.cc files only); used from the
// test's main thread.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/chaos/router_stream_support.h"
#include "tests/fleet/etcd_cluster.h"

namespace baton::deploy_test {

using chaos::Child;
using chaos::ReadFile;
using nlohmann::json;

inline std::string SourceDir() { return BATON_SOURCE_DIR; }
inline std::string BinDir() { return BATON_BIN_DIR; }
// The build folder (BATON_BIN_DIR is its bin/).
inline std::string BuildDir() {
  return std::filesystem::path(BATON_BIN_DIR).parent_path().string();
}

struct ProgramRun {
  int code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `argv` (no shell) with stdout and stderr captured; waits up to `limit`.
inline ProgramRun RunProgram(const std::vector<std::string>& argv,
                             std::chrono::seconds limit = std::chrono::seconds(60)) {
  char tmpl[] = "/tmp/baton-deploy-out-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd >= 0) ::close(fd);
  ProgramRun run;
  {
    Child child(argv, tmpl, /*piped=*/false);
    if (!child.started()) {
      run.output = "cannot start " + argv[0];
      return run;
    }
    run.code = child.Wait(limit);
  }
  run.output = ReadFile(tmpl);
  ::unlink(tmpl);
  return run;
}

// The pids of processes whose environment names `socket` as BATON_SOCKET: the engines of the
// controller on that socket (scripts/serve looks for them the same way).
inline std::vector<pid_t> EnginesOf(const std::string& socket) {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::stringstream env(ReadFile(entry.path().string() + "/environ"));
    std::string var;
    while (std::getline(env, var, '\0')) {
      if (var == "BATON_SOCKET=" + socket) {
        pids.push_back(std::stoi(name));
        break;
      }
    }
  }
  return pids;
}

// A new folder /tmp/baton-<name>-XXXXXX (or /tmp/baton-<name>-failed when none could be made).
inline std::string ScratchDir(const std::string& name) {
  std::string tmpl = "/tmp/baton-" + name + "-XXXXXX";
  return ::mkdtemp(tmpl.data()) != nullptr ? tmpl : "/tmp/baton-" + name + "-failed";
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// Every `from` replaced by `to`.
inline std::string ReplaceAll(std::string text, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = text.find(from, pos)) != std::string::npos; pos += to.size()) {
    text.replace(pos, from.size(), to);
  }
  return text;
}

// One GET to ip:port; status 0 and `error` when no complete answer came.
inline chaos::Reply HttpGet(const std::string& ip, int port, const std::string& target,
                            std::chrono::seconds timeout = std::chrono::seconds(10)) {
  return chaos::Fetch(ip, static_cast<uint16_t>(port), chaos::http::verb::get, target, "", timeout);
}

// Percent-encodes a PromQL query for a URL.
inline std::string UrlEncode(const std::string& s) {
  std::string out;
  char hex[4];
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

inline constexpr const char* kPrometheusBinary = "/usr/bin/prometheus";
inline constexpr const char* kPromtoolBinary = "/usr/bin/promtool";

// Prometheus on 127.0.0.<random 100..199> with `config` (YAML text, written to its folder
// with the files of `rule_files`: name -> text) and its own data folder.
class PrometheusServer {
 public:
  PrometheusServer(const std::string& config,
                   const std::vector<std::pair<std::string, std::string>>& rule_files) {
    char tmpl[] = "/tmp/baton-prometheus-XXXXXX";
    dir_ = ::mkdtemp(tmpl) != nullptr ? tmpl : "/tmp/baton-prometheus-failed";
    for (const auto& [name, text] : rule_files) WriteFile(dir_ + "/" + name, text);
    WriteFile(dir_ + "/prometheus.yml", config);
    std::mt19937 pick(std::random_device{}());
    for (int attempt = 0; attempt < 5 && !ready_; ++attempt) {
      ip_ = "127.0.0." + std::to_string(100 + pick() % 100);
      port_ = fleet_test::FreePort(ip_);
      child_ = std::make_unique<Child>(
          std::vector<std::string>{kPrometheusBinary, "--config.file=" + dir_ + "/prometheus.yml",
                                   "--storage.tsdb.path=" + dir_ + "/data",
                                   "--web.listen-address=" + ip_ + ":" + std::to_string(port_),
                                   "--log.level=warn"},
          dir_ + "/prometheus.log", /*piped=*/false);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (child_->Running() && std::chrono::steady_clock::now() < deadline) {
        if (HttpGet(ip_, port_, "/-/ready", std::chrono::seconds(2)).status == 200) {
          ready_ = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }
  ~PrometheusServer() {
    if (child_ != nullptr) {
      child_->Signal(SIGTERM);
      child_->Wait(std::chrono::seconds(10));
    }
    std::error_code ec;
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir_, ec);
  }
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  bool ready() const { return ready_; }
  std::string Log() const { return chaos::Tail(ReadFile(dir_ + "/prometheus.log"), 30); }
  const std::string& dir() const { return dir_; }

  // GET /api/v1/<path>; its "data" when the status is "success", else null (and `error`).
  json Api(const std::string& path, std::string* error = nullptr) const {
    const chaos::Reply r = HttpGet(ip_, port_, "/api/v1/" + path);
    const json j = json::parse(r.body, nullptr, false);
    if (r.status == 200 && j.is_object() && j.value("status", "") == "success") return j["data"];
    if (error != nullptr) *error = r.error + " HTTP " + std::to_string(r.status) + " " + r.body;
    return nullptr;
  }
  json Query(const std::string& promql, std::string* error = nullptr) const {
    return Api("query?query=" + UrlEncode(promql), error);
  }
  // The state of alert `name` now: "pending", "firing", or "" (inactive or resolved).
  std::string AlertState(const std::string& name) const {
    const json data = Api("alerts");
    if (!data.is_object()) return "?";
    std::string state;
    for (const json& a : data["alerts"]) {
      if (a["labels"].value("alertname", "") != name) continue;
      const std::string s = a.value("state", "");
      if (s == "firing" || state.empty()) state = s;
    }
    return state;
  }
  // Every target's job, instance and health ("up"/"down").
  json Targets() const { return Api("targets"); }

 private:
  std::string dir_, ip_;
  int port_ = 0;
  std::unique_ptr<Child> child_;
  bool ready_ = false;
};

// A Prometheus scrape configuration of the jobs the rules and the dashboard use, every
// `interval_ms`, with `rule_files`.
inline std::string ScrapeConfig(int interval_ms, const std::vector<std::string>& controllers,
                                const std::vector<std::string>& routers,
                                const std::vector<std::string>& engines,
                                const std::vector<std::string>& rule_files) {
  const auto list = [](const std::vector<std::string>& targets) {
    std::string out = "[";
    for (size_t i = 0; i < targets.size(); ++i) out += (i ? ", \"" : "\"") + targets[i] + "\"";
    return out + "]";
  };
  const std::string every = std::to_string(interval_ms) + "ms";
  const std::string timeout = std::to_string(interval_ms * 9 / 10) + "ms";
  std::string out = "global:\n  scrape_interval: " + every + "\n  scrape_timeout: " + timeout +
                    "\n  evaluation_interval: " + every + "\nrule_files:\n";
  for (const std::string& f : rule_files) out += "  - " + f + "\n";
  out += "scrape_configs:\n";
  for (const auto& [job, targets] :
       {std::pair{"baton-controller", controllers}, std::pair{"baton-router", routers},
        std::pair{"baton-engine", engines}}) {
    out += std::string("  - job_name: ") + job +
           "\n    static_configs:\n      - targets: " + list(targets) + "\n";
  }
  return out;
}

// The metric names a PromQL expression reads: identifiers that are not functions, keywords,
// label names (in braces or in by/without/on/ignoring/group_* lists), durations or strings.
inline std::set<std::string> MetricNames(std::string expr) {
  expr = std::regex_replace(expr, std::regex(R"("(?:[^"\\]|\\.)*")"), "\"\"");  // strings
  expr = std::regex_replace(expr, std::regex(R"(\{[^}]*\})"), " ");             // matchers
  expr = std::regex_replace(
      expr, std::regex(R"(\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\))"), " ");
  expr = std::regex_replace(expr, std::regex(R"(\[[^\]]*\])"), " ");  // ranges
  static const std::set<std::string> kKeywords = {
      "by", "without", "on",     "ignoring", "group_left", "group_right", "bool", "and",
      "or", "unless",  "offset", "inf",      "nan",        "Inf",         "NaN"};
  std::set<std::string> names;
  const std::regex ident(R"([a-zA-Z_:][a-zA-Z0-9_:]*)");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), ident);
       it != std::sregex_iterator(); ++it) {
    const std::string word = it->str();
    const size_t after = static_cast<size_t>(it->position() + it->length());
    size_t next = after;
    while (next < expr.size() && std::isspace(static_cast<unsigned char>(expr[next]))) ++next;
    const bool call = next < expr.size() && expr[next] == '(';
    const bool number =
        it->position() > 0 && std::isdigit(static_cast<unsigned char>(expr[it->position() - 1]));
    if (call || number || kKeywords.count(word) != 0) continue;
    names.insert(word);
  }
  return names;
}

}  // namespace baton::deploy_test
