// ParseFlagNumber: a flag's value as a bounded number.
// RunPerfDriver: the main() every perf driver shares: `--help`, flag parsing (a bad flag
// prints the message and the usage and exits 2), the directory of the running binary as the
// default `bin` (where the other Baton binaries are), `--out` created and made absolute, then
// the driver's Run. `Flags` has std::string members `bin` and `out`; `parse` returns "" or
// the error; `run` returns the exit status. Used from main() only.
//
// WorkDir: where a driver keeps its logs: `--out DIR` when given (always kept), else a fresh
// folder under /tmp, removed at the end unless Keep() was called (a failed run's logs).
// FailRun prints a failure the way every driver does: a line on stderr naming where the
// logs are, and {"ok": false, "error": ...} as the last line of stdout; it returns 1.
// EmitResult prints a driver's result as the last line of stdout and, when `dir` is not
// empty, writes it to dir/file too (invalid UTF-8 in strings replaced).
#pragma once

#include <stdlib.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "base/io/self_exe.h"
#include "base/status.h"

namespace baton::perf {

// A flag's value as a number in [lo, hi]; false when it is not one (or out of range).
template <class T>
bool ParseFlagNumber(std::string_view v, T lo, T hi, T* out) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  return ec == std::errc() && p == v.data() + v.size() && *out >= lo && *out <= hi;
}

class WorkDir {
 public:
  // Nullopt (with the reason on stderr) when no temporary folder could be made.
  static std::optional<WorkDir> Make(const std::string& name, const std::string& out) {
    if (!out.empty()) return WorkDir(out, false);
    std::string tmpl = "/tmp/" + name + ".XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror((name + ": mkdtemp").c_str());
      return std::nullopt;
    }
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

 private:
  WorkDir(std::string path, bool remove) : path_(std::move(path)), remove_(remove) {}
  std::string path_;
  bool remove_ = false;
};

inline int FailRun(const std::string& name, const Status& status, WorkDir& work) {
  work.Keep();
  std::fprintf(stderr, "%s: %s; logs in %s\n", name.c_str(), status.ToString().c_str(),
               work.path().c_str());
  std::printf("%s\n", nlohmann::json{{"ok", false}, {"error", status.ToString()}}.dump().c_str());
  return 1;
}

inline void EmitResult(const nlohmann::json& result, const std::string& dir,
                       const std::string& file) {
  const std::string line = result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream(dir + "/" + file) << line << "\n";
  }
  std::printf("%s\n", line.c_str());
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
  if (flags.bin.empty()) {
    flags.bin = SelfExeDir();
  }
  if (!flags.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(flags.out, ec);
    flags.out = std::filesystem::absolute(flags.out).string();
  }
  return run(flags);
}

}  // namespace baton::perf
