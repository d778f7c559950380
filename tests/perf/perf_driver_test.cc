// The perf drivers' shared code (perf/driver_main.h: the --out check, EmitResult, WorkDir;
// perf/pair/failover_procs.h: the crash-loop check) and the drivers run as processes on their
// failure paths: each ends with {"ok": false, ...} as the last line of stdout, and what it
// started does not outlive it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "perf/driver_main.h"
#include "perf/pair/failover_procs.h"

namespace baton::perf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh folder under the test's temporary directory, removed at the end.
class TempFolder {
 public:
  TempFolder() {
    std::string tmpl = ::testing::TempDir() + "baton-perf-test.XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempFolder() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

json LastLineJson(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const size_t nl = text.rfind('\n');
  return json::parse(nl == std::string::npos ? text : text.substr(nl + 1), nullptr, false);
}

struct ProgramRun {
  pid_t pid = -1;
  int status = 0;
  std::string out, err;
};

// Starts build/bin/`program` with `args`, stdout and stderr into files under `dir`.
pid_t StartProgram(const std::string& program, const std::vector<std::string>& args,
                   const std::string& dir) {
  const std::string path = std::string(BATON_BIN_DIR) + "/" + program;
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const int out = ::open((dir + "/stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = ::open((dir + "/stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(out, STDOUT_FILENO);
  ::dup2(err, STDERR_FILENO);
  std::vector<char*> argv = {const_cast<char*>(path.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(path.c_str(), argv.data());
  ::_exit(127);
}

ProgramRun Finish(pid_t pid, const std::string& dir) {
  ProgramRun run;
  run.pid = pid;
  while (::waitpid(pid, &run.status, 0) < 0 && errno == EINTR) {
  }
  run.out = ReadAll(dir + "/stdout");
  run.err = ReadAll(dir + "/stderr");
  return run;
}

ProgramRun RunProgram(const std::string& program, const std::vector<std::string>& args,
                      const std::string& dir) {
  return Finish(StartProgram(program, args, dir), dir);
}

int ExitCode(const ProgramRun& run) { return WIFEXITED(run.status) ? WEXITSTATUS(run.status) : -1; }

// ---- driver_main.h -------------------------------------------------------------------------

TEST(PrepareOutDir, CreatesTheFolderAndMakesItAbsolute) {
  TempFolder t;
  Result<std::string> out = PrepareOutDir(t.path() + "/a/b");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(fs::is_directory(*out));
  EXPECT_TRUE(fs::path(*out).is_absolute());
}

TEST(PrepareOutDir, RefusesAFolderUnderARegularFile) {
  TempFolder t;
  std::ofstream(t.path() + "/f") << "x";
  Result<std::string> out = PrepareOutDir(t.path() + "/f/x");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("f/x"), std::string::npos) << out.status().ToString();
}

TEST(PrepareOutDir, RefusesARegularFile) {
  TempFolder t;
  std::ofstream(t.path() + "/f") << "x";
  EXPECT_FALSE(PrepareOutDir(t.path() + "/f").ok());
}

TEST(EmitResult, WritesTheFileAndPrintsTheLine) {
  TempFolder t;
  ::testing::internal::CaptureStdout();
  const Status s = EmitResult(json{{"x", 1}}, t.path(), "r.json");
  const std::string printed = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(LastLineJson(printed)["x"], 1);
  EXPECT_EQ(LastLineJson(ReadAll(t.path() + "/r.json"))["x"], 1);
}

TEST(EmitResult, AFileThatCannotBeWrittenIsAnError) {
  TempFolder t;
  std::ofstream(t.path() + "/f") << "x";
  ::testing::internal::CaptureStdout();
  const Status s = EmitResult(json{{"x", 1}}, t.path() + "/f/x", "r.json");
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(LastLineJson(printed)["x"], 1);  // the numbers are not lost
}

TEST(FailRun, PrintsTheErrorAsTheLastLine) {
  ::testing::internal::CaptureStdout();
  const int code = FailRun("test", Internal("it broke"));
  const json j = LastLineJson(::testing::internal::GetCapturedStdout());
  EXPECT_EQ(code, 1);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["error"], "INTERNAL: it broke");
}

TEST(WorkDir, ATemporaryFolderGoesUnlessKept) {
  std::string gone, kept;
  {
    Result<WorkDir> w = WorkDir::Make("baton-perf-test", "");
    ASSERT_TRUE(w.ok());
    EXPECT_FALSE(w->kept());
    gone = w->path();
  }
  EXPECT_FALSE(fs::exists(gone));
  {
    Result<WorkDir> w = WorkDir::Make("baton-perf-test", "");
    ASSERT_TRUE(w.ok());
    w->Keep();
    EXPECT_TRUE(w->kept());
    kept = w->path();
  }
  EXPECT_TRUE(fs::exists(kept));
  fs::remove_all(kept);
  TempFolder t;
  Result<WorkDir> out = WorkDir::Make("baton-perf-test", t.path());
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->kept());  // --out is always kept
}

// ---- the crash-loop check ------------------------------------------------------------------

TEST(CrashLoopStatus, ADownPairInItsBackoffIsAnErrorNamingTheCrashLoop) {
  const json status = {{"pair", {{"state", "down_backoff"}}},
                       {"crash_loop",
                        {{"in_backoff", true},
                         {"recent_failures", 1000},
                         {"total_failures", 1000},
                         {"max_failures", 1000},
                         {"window_s", 60.0},
                         {"next_restart_in_ms", 1000.0}}}};
  const Status s = CrashLoopStatus(status, "/x/controller.log");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("crash-loop"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("down_backoff"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("/x/controller.log"), std::string::npos) << s.ToString();
}

TEST(CrashLoopStatus, AnyOtherStateIsNoCrashLoop) {
  for (const char* state : {"starting", "ready", "degraded", "failing_over", "down",
                            "degraded_backoff", "recovering"}) {
    EXPECT_TRUE(CrashLoopStatus(json{{"pair", {{"state", state}}}}, "log").ok()) << state;
  }
  EXPECT_TRUE(CrashLoopStatus(json::object(), "log").ok());
  EXPECT_TRUE(CrashLoopStatus(json(nullptr), "log").ok());
}

// ---- the drivers as processes --------------------------------------------------------------

class DriverProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* p : {"baton-perf-weightload", "baton-perf-gpu-check", "baton-mkmodel"}) {
      if (!fs::exists(std::string(BATON_BIN_DIR) + "/" + p)) GTEST_SKIP() << p << " is not built";
    }
  }
  // baton-mkmodel's tiny preset in dir/model.
  std::string TinyModel() {
    const std::string model = t_.path() + "/model";
    ProgramRun mk = RunProgram("baton-mkmodel", {"--out", model, "--preset", "tiny"}, t_.path());
    EXPECT_EQ(ExitCode(mk), 0) << mk.err;
    return model;
  }
  TempFolder t_;
};

TEST_F(DriverProcessTest, WeightloadWithoutAModelPrintsTheJsonError) {
  ProgramRun run = RunProgram("baton-perf-weightload", {"--model", "/nonexistent"}, t_.path());
  EXPECT_EQ(ExitCode(run), 1) << run.err;
  const json j = LastLineJson(run.out);
  EXPECT_EQ(j["ok"], false) << run.out;
  EXPECT_NE(j.value("error", "").find("/nonexistent"), std::string::npos) << run.out;
}

TEST_F(DriverProcessTest, WeightloadHelpIsTheUsageOnStdout) {
  ProgramRun run = RunProgram("baton-perf-weightload", {"--help"}, t_.path());
  EXPECT_EQ(ExitCode(run), 0) << run.err;
  EXPECT_EQ(run.out.rfind("usage: baton-perf-weightload", 0), 0u) << run.out;
}

TEST_F(DriverProcessTest, WeightloadWithAnUnwritableOutFailsBeforeMeasuring) {
  const std::string model = TinyModel();
  std::ofstream(t_.path() + "/f") << "x";
  ProgramRun run =
      RunProgram("baton-perf-weightload",
                 {"--model", model, "--rounds", "1", "--out", t_.path() + "/f/x"}, t_.path());
  EXPECT_EQ(ExitCode(run), 1) << run.err;
  const json j = LastLineJson(run.out);
  EXPECT_EQ(j["ok"], false) << run.out;
  EXPECT_NE(j.value("error", "").find("--out"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("round 1/1"), std::string::npos) << "measured anyway";
}

// A SIGTERM while fio runs: the run guard stops fio, the JSON error is the last line, and the
// signal ends the driver. fio here is a script that records its pid and sleeps.
TEST_F(DriverProcessTest, WeightloadStopsFioOnSigterm) {
  const std::string model = TinyModel();
  const std::string fio = t_.path() + "/fake-fio", pid_file = t_.path() + "/fio.pid";
  std::ofstream(fio) << "#!/bin/sh\necho $$ > " << pid_file << ".tmp\nmv " << pid_file << ".tmp "
                     << pid_file << "\nexec sleep 300\n";
  ::chmod(fio.c_str(), 0755);
  // Started with SIGHUP ignored, as under nohup: it stays ignored.
  struct sigaction ignore {
  }, before{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGHUP, &ignore, &before);
  const pid_t driver = StartProgram("baton-perf-weightload",
                                    {"--model", model, "--rounds", "1", "--fio", fio}, t_.path());
  ::sigaction(SIGHUP, &before, nullptr);
  ASSERT_GT(driver, 0);
  pid_t fio_pid = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (fio_pid == 0 && std::chrono::steady_clock::now() < deadline) {
    std::ifstream(pid_file) >> fio_pid;
    if (fio_pid == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(driver, SIGHUP);  // delivered before the SIGTERM (the lower number): ignored
  ::kill(driver, SIGTERM);
  ProgramRun run = Finish(driver, t_.path());
  ASSERT_GT(fio_pid, 0) << "the fake fio never started: " << run.err;
  EXPECT_TRUE(WIFSIGNALED(run.status) && WTERMSIG(run.status) == SIGTERM) << run.status;
  EXPECT_EQ(LastLineJson(run.out), json::parse(R"({"ok":false,"error":"stopped by SIGTERM"})"))
      << run.out;
  // Gone, or a zombie that init has yet to reap: not running either way.
  const std::string stat = ReadAll("/proc/" + std::to_string(fio_pid) + "/stat");
  const size_t paren = stat.rfind(')');
  EXPECT_TRUE(stat.empty() || (paren != std::string::npos && stat.substr(paren + 2, 1) == "Z"))
      << "fio (pid " << fio_pid << ") outlived the driver: " << stat;
}

TEST_F(DriverProcessTest, GpuCheckNamesAnUnknownFlag) {
  ProgramRun run = RunProgram("baton-perf-gpu-check", {"--bogus"}, t_.path());
  EXPECT_EQ(ExitCode(run), 2);
  EXPECT_NE(run.err.find("unknown flag --bogus"), std::string::npos) << run.err;
  ProgramRun help = RunProgram("baton-perf-gpu-check", {"--help"}, t_.path());
  EXPECT_EQ(ExitCode(help), 0) << help.err;
  EXPECT_EQ(help.out.rfind("usage: baton-perf-gpu-check", 0), 0u) << help.out;
}

}  // namespace
}  // namespace baton::perf
