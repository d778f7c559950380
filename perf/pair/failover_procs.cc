#include "perf/pair/failover_procs.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>

#include "perf/weights/weightload_contenders.h"

extern char** environ;

namespace baton::perf {

Result<ChildProcess> ChildProcess::Spawn(const std::vector<std::string>& argv,
                                         const std::string& log_path) {
  if (argv.empty()) return InvalidArgument("an empty command line");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return ErrnoStatus("start " + argv[0], rc);
  return ChildProcess(pid);
}

ChildProcess::~ChildProcess() {
  if (pid_ == 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

bool ChildProcess::Running() {
  if (pid_ == 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  pid_ = 0;
  return false;
}

int ChildProcess::Stop(std::chrono::milliseconds grace) {
  if (!Running()) return exit_code_;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (Running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (pid_ != 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    exit_code_ = 128 + SIGKILL;
    pid_ = 0;
  }
  return exit_code_;
}

Result<nlohmann::json> BatonctlJson(const std::string& batonctl, const std::string& socket,
                                    const std::vector<std::string>& args) {
  std::vector<std::string> argv = {batonctl, "--json", "--socket", socket, "--timeout-ms", "2000"};
  argv.insert(argv.end(), args.begin(), args.end());
  BATON_ASSIGN_OR_RETURN(CommandResult run, RunCommand(argv));
  std::string out = run.out;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  const size_t nl = out.rfind('\n');
  nlohmann::json j = nlohmann::json::parse(nl == std::string::npos ? out : out.substr(nl + 1),
                                           nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Internal("batonctl printed no JSON object: " + out.substr(0, 200));
  if (!j.value("ok", true)) return Internal("batonctl: " + j.value("error", std::string("?")));
  return j;
}

Status CrashLoopStatus(const nlohmann::json& status, const std::string& log) {
  if (!status.is_object() || !status.contains("pair") || !status["pair"].is_object()) {
    return OkStatus();
  }
  const std::string state = status["pair"].value("state", "");
  if (state != "down_backoff") return OkStatus();
  const nlohmann::json guard =
      status.contains("crash_loop") ? status["crash_loop"] : nlohmann::json::object();
  char detail[160];
  std::snprintf(detail, sizeof(detail),
                "%d engine failures so far, the guard trips at %d in %.0f s; next restart in "
                "%.0f ms",
                guard.value("total_failures", 0), guard.value("max_failures", 0),
                guard.value("window_s", 0.0), guard.value("next_restart_in_ms", 0.0));
  return Unavailable(
      "the engines are crash-looping: the controller's crash-loop guard holds the "
      "pair down (" +
      state + ": " + detail + "); see " + log + " and the engines' logs");
}

Result<uint16_t> WaitForPortFile(const std::string& path, ChildProcess& child,
                                 std::chrono::milliseconds timeout, std::chrono::microseconds poll,
                                 const std::string& log) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    unsigned port = 0;
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      if (std::fscanf(f, "%u", &port) != 1) port = 0;
      std::fclose(f);
    }
    if (port != 0 && port <= 65535) return static_cast<uint16_t>(port);
    if (!child.Running()) return Unavailable("the engine exited before listening; see " + log);
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceeded("the engine did not listen within " +
                              std::to_string(timeout.count()) + " ms; see " + log);
    }
    std::this_thread::sleep_for(poll);
  }
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(v.size()));
  const size_t i = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(v.size())));
  return v[i - 1];
}

std::optional<int64_t> LogLineMicros(std::string_view line) {
  int y, mo, d, h, mi, s;
  long us;
  if (line.size() < 27 ||
      std::sscanf(std::string(line.substr(0, 27)).c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%6ldZ", &y, &mo,
                  &d, &h, &mi, &s, &us) != 7) {
    return std::nullopt;
  }
  std::tm parts{};
  parts.tm_year = y - 1900;
  parts.tm_mon = mo - 1;
  parts.tm_mday = d;
  parts.tm_hour = h;
  parts.tm_min = mi;
  parts.tm_sec = s;
  return static_cast<int64_t>(::timegm(&parts)) * 1000000 + us;
}

std::string FindLine(const std::string& path, const std::vector<std::string>& needles) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    bool all = true;
    for (const std::string& n : needles) all = all && line.find(n) != std::string::npos;
    if (all) return line;
  }
  return "";
}

int64_t WallMicros() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

}  // namespace baton::perf
