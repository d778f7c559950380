// ParseFlagNumber: a flag's value as a bounded number.
// RunPerfDriver: the main() every perf driver shares: `--help` (the usage on stdout, exit 0),
// flag parsing (a bad flag prints the message and the usage and exits 2), the directory of
// the running binary as the default `bin` (where the other Baton binaries are), `--out`
// created, checked writable and made absolute (PrepareOutDir; one that cannot be is a
// failure: the JSON error, exit 1), then the driver's Run. Before the run (StartPerfRun): a
// RunGuard (base/process/run_guard.h: whatever the run starts is killed when it ends, however
// it ends), SIGINT, SIGTERM and SIGHUP made to end the run with the JSON error as the last
// line (StopLineOnSignal), and the check for stale Baton processes (stale_processes.h; the
// models it looks for are the flags' values that are model folders, with a config.json),
// whose report EmitResult and FailRun add as `stale_processes`.
// `Flags` has std::string members `bin` and `out`; `parse` returns "" or
// the error; `run` returns the exit status. Used from main() only.
//
// WorkDir: where a driver keeps its logs: `--out DIR` when given (always kept), else a fresh
// folder under /tmp, removed at the end unless Keep() was called (a failed run's logs).
// FailRun prints a failure the way every driver does: a line on stderr (naming where the
// logs are, when there is a WorkDir), and {"ok": false, "error": ...} as the last line of
// stdout; it returns 1.
// EmitResult prints a driver's result as the last line of stdout and, when `dir` is not
// empty, writes it to dir/file too (invalid UTF-8 in strings replaced); when that file cannot
// be written it still prints the result, and returns the error for the caller's FailRun.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/io/self_exe.h"
#include "base/process/run_guard.h"
#include "base/status.h"
#include "perf/stale_processes.h"

namespace baton::perf {

// A flag's value as a number in [lo, hi]; false when it is not one (or out of range).
template <class T>
bool ParseFlagNumber(std::string_view v, T lo, T hi, T* out) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  return ec == std::errc() && p == v.data() + v.size() && *out >= lo && *out <= hi;
}

class WorkDir {
 public:
  // An error when no temporary folder could be made.
  static Result<WorkDir> Make(const std::string& name, const std::string& out) {
    if (!out.empty()) return WorkDir(out, false);
    std::string tmpl = "/tmp/" + name + ".XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoStatus("mkdtemp " + tmpl, errno);
    RunGuard::RemoveIfInterrupted(tmpl);  // a signal or kill -9 skips the destructor
    return WorkDir(tmpl, true);
  }
  WorkDir(WorkDir&& other) noexcept : path_(std::move(other.path_)), remove_(other.remove_) {
    other.remove_ = false;
  }
  WorkDir& operator=(WorkDir&&) = delete;
  ~WorkDir() {
    std::error_code ec;
    if (remove_) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  void Keep() { remove_ = false; }
  // Whether the folder stays after the run (--out, or Keep()); a JSON names it only then.
  bool kept() const { return !remove_; }

 private:
  WorkDir(std::string path, bool remove) : path_(std::move(path)), remove_(remove) {}
  std::string path_;
  bool remove_ = false;
};

// The stale-process report of this run, set by StartPerfRun (null before).
inline nlohmann::json& StaleProcessesJson() {
  static nlohmann::json report;
  return report;
}

// A run without a log folder (or before it has one). `logs`: where the logs are, or "".
inline int FailRun(const std::string& name, const Status& status, const std::string& logs = "") {
  std::fprintf(stderr, "%s: %s%s%s\n", name.c_str(), status.ToString().c_str(),
               logs.empty() ? "" : "; logs in ", logs.c_str());
  nlohmann::json failed{{"ok", false}, {"error", status.ToString()}};
  if (!StaleProcessesJson().is_null()) failed["stale_processes"] = StaleProcessesJson();
  std::printf("%s\n",
              failed.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
  return 1;
}

// SIGINT, SIGTERM or SIGHUP during a run, once the run guard's handler has stopped what the
// run started (RunGuard::SetSignalHook): {"ok": false, "error": "stopped by SIG..."} on a
// line of its own (whatever stdio had not written yet is lost with the process, and a line
// it had half written is ended first, so it is the last line); the signal then ends the
// process as it would have. Async-signal-safe.
inline void StopLineOnSignal(int sig) {
  const char* line = sig == SIGINT   ? "\n{\"ok\":false,\"error\":\"stopped by SIGINT\"}\n"
                     : sig == SIGHUP ? "\n{\"ok\":false,\"error\":\"stopped by SIGHUP\"}\n"
                                     : "\n{\"ok\":false,\"error\":\"stopped by SIGTERM\"}\n";
  [[maybe_unused]] const ssize_t written = ::write(STDOUT_FILENO, line, std::strlen(line));
}

// The guard and the stale check every driver starts with: the folders among `args` that hold
// a model (a config.json) are the models the check looks for. Returns 1 (FailRun's JSON
// error last) when the guard cannot start, else 0. The guard handles the signals left at
// their default (an ignored one, under `nohup` or in a shell's background job, stays
// ignored); StopLineOnSignal adds the JSON line.
inline int StartPerfRun(const char* name, int argc, char** argv) {
  if (Status guarded = RunGuard::Install(name); !guarded.ok()) return FailRun(name, guarded);
  RunGuard::SetSignalHook(StopLineOnSignal);
  std::vector<std::string> model_dirs;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::path(argv[i]) / "config.json", ec)) {
      model_dirs.push_back(std::filesystem::absolute(argv[i], ec).lexically_normal().string());
    }
  }
  const StaleReport report = FindStaleProcesses(model_dirs);
  WarnAboutStaleProcesses(name, report);
  StaleProcessesJson() = StaleReportJson(report);
  return 0;
}

inline int FailRun(const std::string& name, const Status& status, WorkDir& work) {
  work.Keep();
  return FailRun(name, status, work.path());
}

// `dir` created when missing, checked to be a folder this process can write into; its
// absolute path.
[[nodiscard]] inline Result<std::string> PrepareOutDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return FailedPrecondition("--out " + dir + ": cannot create it: " + ec.message());
  if (!std::filesystem::is_directory(dir, ec)) {
    return FailedPrecondition("--out " + dir + ": not a directory");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return ErrnoStatus("--out " + dir + ": cannot write into it", errno);
  }
  const std::filesystem::path absolute = std::filesystem::absolute(dir, ec);
  if (ec) return FailedPrecondition("--out " + dir + ": " + ec.message());
  return absolute.lexically_normal().string();
}

[[nodiscard]] inline Status EmitResult(nlohmann::json result, const std::string& dir,
                                       const std::string& file) {
  if (!StaleProcessesJson().is_null() && result.is_object()) {
    result["stale_processes"] = StaleProcessesJson();
  }
  const std::string line = result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  Status written = OkStatus();
  if (!dir.empty()) {
    const std::string path = dir + "/" + file;
    if (Result<std::string> ready = PrepareOutDir(dir); !ready.ok()) {
      written = ready.status();
    } else {
      std::ofstream out(path);
      out << line << "\n";
      out.close();
      if (!out) written = ErrnoStatus("write " + path, errno);
    }
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return written;
}

template <class Flags, class Parse, class Run>
int RunPerfDriver(int argc, char** argv, const char* name, const char* usage, Parse parse,
                  Run run) {
  Flags flags;
  if (argc > 1 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::fputs(usage, stdout);
    return 0;
  }
  if (const std::string error = parse(argc, argv, &flags); !error.empty()) {
    std::fprintf(stderr, "%s: %s\n%s", name, error.c_str(), usage);
    return 2;
  }
  if (const int started = StartPerfRun(name, argc, argv); started != 0) return started;
  if (flags.bin.empty()) {
    flags.bin = SelfExeDir();
  }
  if (!flags.out.empty()) {
    Result<std::string> out = PrepareOutDir(flags.out);
    if (!out.ok()) return FailRun(name, out.status());
    flags.out = *out;
  }
  return run(flags);
}

}  // namespace baton::perf
