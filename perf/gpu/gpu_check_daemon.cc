#include "perf/gpu/gpu_check_daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace baton {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

json RunJson(const std::string& command) {
  FILE* p = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return nullptr;
  std::string out, last;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  ::pclose(p);
  size_t end = out.find_last_not_of('\n');
  if (end == std::string::npos) return nullptr;
  size_t begin = out.rfind('\n', end);
  const size_t from = begin == std::string::npos ? 0 : begin + 1;
  last = out.substr(from, end + 1 - from);
  return json::parse(last, nullptr, /*allow_exceptions=*/false);
}

json EngineWithRole(const json& status, const std::string& role) {
  if (!status.is_object() || !status.contains("engines")) return nullptr;
  for (const json& e : status["engines"]) {
    if (e.value("role", "") == role) return e;
  }
  return nullptr;
}

bool IsReady(const json& s) {
  if (!s.is_object() || !s.contains("pair") || s["pair"].value("state", "") != "ready") {
    return false;
  }
  const json p = EngineWithRole(s, "primary");
  return !p.is_null() && p.value("serving", false) && !EngineWithRole(s, "standby").is_null();
}

json FailStep(json r, const std::string& error) {
  r["ok"] = false;
  r["error"] = error;
  return r;
}

size_t CountFiles(const std::string& dir) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

json WaitForReports(const std::string& dir, int want, int timeout_s) {
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  while (true) {
    json reports = json::array();
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(dir + "/reports", ec)) {
      if (f.path().extension() != ".json") continue;
      std::ifstream in(f.path());
      reports.push_back(json::parse(in, nullptr, /*allow_exceptions=*/false));
    }
    if (static_cast<int>(reports.size()) >= want) return reports;
    if (Clock::now() >= deadline) return nullptr;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string StepModel(const std::string& bin_dir, const std::string& work_dir,
                      const std::string& preset, const std::string& dtype) {
  const std::string dir = work_dir + "/model-" + preset + "-" + dtype;
  const std::string mk = bin_dir + "/baton-mkmodel --reuse --out " + dir + " --preset " + preset +
                         " --dtype " + dtype + " --threads 8 > " + dir + ".log 2>&1";
  return std::system(mk.c_str()) == 0 ? dir : "";
}

bool StepController::WriteConfig(const std::string& toml) const {
  std::ofstream out(dir_ + "/controller.toml");
  out << "[controller]\nruntime_dir = " << json(dir_ + "/run") << "\n" << toml;
  return out.good();
}

bool StepController::Start() {
  const std::string bin = bin_dir_ + "/baton-controller";
  const std::string config = dir_ + "/controller.toml", log = dir_ + "/controller.log";
  started_at_ = Clock::now();
  pid_ = ::fork();
  if (pid_ < 0) return false;
  if (pid_ == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    ::execl(bin.c_str(), bin.c_str(), "--config", config.c_str(), nullptr);
    ::_exit(127);
  }
  return true;
}

void StepController::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void StepController::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 200; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Kill();
}

json StepController::Ctl(const std::string& args) const {
  return RunJson(bin_dir_ + "/batonctl --json --socket " + Socket() + " " + args);
}

json StepController::WaitFor(const std::function<bool(const json&)>& pred, bool* held,
                             int timeout_s) const {
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s > 0 ? timeout_s : timeout_s_);
  json s;
  while (Clock::now() < deadline) {
    s = Ctl("status");
    if (pred(s)) {
      *held = true;
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *held = false;
  return s;
}

std::string StepController::Log() const {
  std::stringstream text;
  text << std::ifstream(dir_ + "/controller.log").rdbuf();
  return text.str();
}

}  // namespace baton
