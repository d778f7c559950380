// baton-perf-gpu-check: the CUDA backend measured on a GPU host (driven by perf/gpu_check).
//
//   baton-perf-gpu-check [--out DIR] [--device N] [--weights-gib 16,64] [--pool-gib 32]
//       [--pool-chunk-mib 256] [--weight-chunk-mib 1024] [--remat-gib 16] [--remat-streams 4]
//       [--remat-chunk-mib 64] [--reps 3] [--drill-runs 2] [--deadline-s 420]
//       [--steps remat,drill,pair,torch,restart,registration] [--torch-engine PATH]
//       [--restart-model 4g] [--restart-dtype bf16] [--restart-ready-ms 50] [--failovers 10]
//       [--torch-failovers 5] [--registration-hang-ms 200] [--expect-torch]
//       [--unit-tests PASSED,FAILED,SKIPPED,RC]
//
// Prints one JSON object as the last line of stdout and writes it to DIR/gpu_check.json.
// Without a usable GPU that object is {"gpu": false, "reason": ...} and the exit code is 0.
// With one: device facts, rematerialization against the plain pinned copy, and the promotion
// drill (cuda/drill/device_drill.h) for each weight set, and the real controller's pair on the
// device with a kill -9 failover (perf/gpu/gpu_check_pair.h), and that pair once more with
// PyTorch engines on the C ABI (--torch-engine: perf/gpu/gpu_check_torch_engine.py; the step is
// skipped without it; --expect-torch: each engine must have computed with PyTorch on the GPU,
// not fallen back to the C ABI alone) on the --restart-model, the pairs failing over
// --failovers and --torch-failovers times, the
// controller killed and restarted on that model with the device memory adopted, and an
// engine registering on a 4 KiB-page arena without being taken for hung
// (perf/gpu/gpu_check_restart.h); `--steps` picks a subset. Exit 0
// when every step passed (promotion at most 1000 ms, rematerialization at least 90 % of the
// baseline, every check true), 1
// when a step failed or missed its target, 3 when the deadline passed (the JSON says where).
// `meets_targets` says whether the failover targets were met (the drill's promotion at most
// 15 ms, the PyTorch pair's ready_ms p50 at most 10 ms and p99 at most 25 ms); a missed one
// is reported there, and does not fail the run.
// `--drill-peer ARGS...` runs this binary as a drill peer (internal).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/io/self_exe.h"
#include "base/log.h"
#include "cuda/driver/gpu_backend.h"
#include "perf/driver_main.h"
#include "perf/gpu/gpu_check_daemon.h"
#include "perf/gpu/gpu_check_pair.h"
#include "perf/gpu/gpu_check_restart.h"

#ifdef BATON_HAVE_CUDA_HEADERS
#include "cuda/drill/device_drill.h"
#include "cuda/driver/cuda_driver.h"
#include "perf/gpu/gpu_check_steps.h"
#endif

namespace baton {
namespace {

using json = nlohmann::json;

constexpr char kUsage[] =
    "usage: baton-perf-gpu-check [--out DIR] [--device N] [--weights-gib 16,64] [--pool-gib 32]\n"
    "    [--pool-chunk-mib 256] [--weight-chunk-mib 1024] [--remat-gib 16] [--remat-streams 4]\n"
    "    [--remat-chunk-mib 64] [--reps 3] [--drill-runs 2] [--deadline-s 420]\n"
    "    [--steps remat,drill,pair,torch,restart,registration] [--torch-engine PATH]\n"
    "    [--restart-model 4g] [--restart-dtype bf16] [--restart-ready-ms 50] [--failovers 10]\n"
    "    [--torch-failovers 5] [--registration-hang-ms 200] [--expect-torch]\n"
    "    [--unit-tests PASSED,FAILED,SKIPPED,RC]\n"
    "the header of perf/gpu/gpu_check_main.cc says what each does; perf/gpu_check runs it\n";

struct Flags {
  std::string out = "out/gpu_check";
  int device = 0;
  std::vector<uint64_t> weight_gib = {16, 64};
  uint64_t pool_gib = 32;
  uint64_t pool_chunk_mib = 256;
  uint64_t weight_chunk_mib = 1024;
  uint64_t remat_gib = 16;
  int remat_streams = 4;
  uint64_t remat_chunk_mib = 64;
  int reps = 3;
  int drill_runs = 2;
  int deadline_s = 420;
  std::string steps = "remat,drill,pair,torch,restart,registration";
  std::string torch_engine;
  std::string restart_model = "4g";
  std::string restart_dtype = "bf16";
  double restart_ready_ms = 50;
  int failovers = 10;
  int torch_failovers = 5;
  int registration_hang_ms = 200;
  bool expect_torch = false;
  std::string unit_tests;
  bool Runs(const std::string& step) const {
    return ("," + steps + ",").find("," + step + ",") != std::string::npos;
  }
};

std::atomic<const char*> g_step{"start"};
std::string g_out_file;
std::mutex g_partial_mu;
json g_partial;  // the result as of the last finished step, for the watchdog

// Records the result so far: a deadline that passes later still reports it.
void Snapshot(const json& result) {
  std::lock_guard<std::mutex> lock(g_partial_mu);
  g_partial = result;
}

// A step has ended: its seconds go into result["step_s"][name] (what each step costs on a
// GPU host, against the run's deadline), then the result is recorded.
std::chrono::steady_clock::time_point g_step_start = std::chrono::steady_clock::now();
[[maybe_unused]] void Finished(json& result, const std::string& name) {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - g_step_start).count();
  g_step_start = now;
  result["step_s"][name] = std::round(seconds * 10) / 10;
  Snapshot(result);
}

// Prints `object` as the last line and writes it to the out folder.
void Emit(json object) {
  if (!perf::StaleProcessesJson().is_null()) object["stale_processes"] = perf::StaleProcessesJson();
  const std::string line = object.dump();
  std::ofstream(g_out_file, std::ios::trunc) << line << "\n";
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// Ends the run if it outlives its deadline: a last JSON line with the steps that finished and
// the one that did not, exit 3.
void StartWatchdog(int seconds) {
  std::thread([seconds] {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    json last;
    {
      std::lock_guard<std::mutex> lock(g_partial_mu);
      last = g_partial.is_object() ? g_partial : json::object();
    }
    last["gpu"] = true;
    last["ok"] = false;
    last["error"] = "deadline of " + std::to_string(seconds) + " s passed during step " +
                    std::string(g_step.load());
    const std::string line = last.dump() + "\n";
    const int fd = ::open(g_out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      (void)!::write(fd, line.data(), line.size());
      ::close(fd);
    }
    (void)!::write(STDOUT_FILENO, line.data(), line.size());
    RunGuard::Finish();  // the steps' processes go with the run
    ::_exit(3);
  }).detach();
}

std::vector<uint64_t> ParseList(const std::string& text) {
  std::vector<uint64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::strtoull(item.c_str(), nullptr, 10));
  return out;
}

std::string ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return "help";
    if (arg == "--expect-torch") {
      f->expect_torch = true;
      continue;
    }
    static const char* const kValueFlags[] = {
        "--out",           "--device",          "--weights-gib",
        "--pool-gib",      "--pool-chunk-mib",  "--weight-chunk-mib",
        "--remat-gib",     "--remat-streams",   "--remat-chunk-mib",
        "--reps",          "--drill-runs",      "--deadline-s",
        "--unit-tests",    "--steps",           "--torch-engine",
        "--restart-model", "--restart-dtype",   "--restart-ready-ms",
        "--failovers",     "--torch-failovers", "--registration-hang-ms"};
    if (std::find(std::begin(kValueFlags), std::end(kValueFlags), arg) == std::end(kValueFlags)) {
      return "unknown flag " + arg;
    }
    if (i + 1 >= argc) return arg + " needs a value";
    const std::string v = argv[++i];
    auto num = [&v] { return std::strtoull(v.c_str(), nullptr, 10); };
    if (arg == "--out")
      f->out = v;
    else if (arg == "--device")
      f->device = static_cast<int>(num());
    else if (arg == "--weights-gib")
      f->weight_gib = ParseList(v);
    else if (arg == "--pool-gib")
      f->pool_gib = num();
    else if (arg == "--pool-chunk-mib")
      f->pool_chunk_mib = num();
    else if (arg == "--weight-chunk-mib")
      f->weight_chunk_mib = num();
    else if (arg == "--remat-gib")
      f->remat_gib = num();
    else if (arg == "--remat-streams")
      f->remat_streams = static_cast<int>(num());
    else if (arg == "--remat-chunk-mib")
      f->remat_chunk_mib = num();
    else if (arg == "--reps")
      f->reps = static_cast<int>(num());
    else if (arg == "--drill-runs")
      f->drill_runs = static_cast<int>(num());
    else if (arg == "--deadline-s")
      f->deadline_s = static_cast<int>(num());
    else if (arg == "--unit-tests")
      f->unit_tests = v;
    else if (arg == "--steps")
      f->steps = v;
    else if (arg == "--torch-engine")
      f->torch_engine = v;
    else if (arg == "--restart-model")
      f->restart_model = v;
    else if (arg == "--restart-dtype")
      f->restart_dtype = v;
    else if (arg == "--restart-ready-ms")
      f->restart_ready_ms = std::strtod(v.c_str(), nullptr);
    else if (arg == "--failovers")
      f->failovers = static_cast<int>(num());
    else if (arg == "--torch-failovers")
      f->torch_failovers = static_cast<int>(num());
    else if (arg == "--registration-hang-ms")
      f->registration_hang_ms = static_cast<int>(num());
    else
      return "unknown flag " + arg;
  }
  for (uint64_t w : f->weight_gib) {
    if (w == 0) return "--weights-gib: sizes must be positive";
  }
  if (f->pool_gib == 0 || f->pool_chunk_mib == 0 || f->weight_chunk_mib == 0 || f->remat_gib == 0 ||
      f->remat_chunk_mib == 0 || f->reps < 1 || f->drill_runs < 1 || f->remat_streams < 1 ||
      f->failovers < 1 || f->failovers > 100 || f->torch_failovers < 1 ||
      f->torch_failovers > 100) {
    return "sizes, counts and streams must be positive (--failovers and --torch-failovers 1 to "
           "100)";
  }
  return "";
}

constexpr double kDrillPromotionTargetMs = 15;

json UnitTests(const std::string& text) {
  if (text.empty()) return json{{"ran", false}};
  const std::vector<uint64_t> v = ParseList(text);
  if (v.size() != 4) return json{{"ran", true}, {"raw", text}};
  return json{{"ran", true},     {"passed", v[0]},    {"failed", v[1]},
              {"skipped", v[2]}, {"exit_code", v[3]}, {"ok", v[1] == 0 && v[3] == 0}};
}

// The failover targets of docs/gpu.md against the steps that ran: {"all": ..., one per target}.
[[maybe_unused]] json MeetsTargets(const json& result) {
  json m = json::object();
  if (result.contains("promotion") && !result["promotion"].empty()) {
    bool drill = true;
    for (const json& d : result["promotion"]) {
      drill = drill && d.value("promotion_ms_max", 1e9) <= kDrillPromotionTargetMs;
    }
    m["drill_promotion_ms"] = drill;
  }
  if (result.contains("torch") && !result["torch"].contains("skipped")) {
    m["torch_ready_ms"] = result["torch"].value("meets_targets", false);  // false: it failed
  }
  bool all = true;
  for (const auto& [name, met] : m.items()) all = all && met.get<bool>();
  m["all"] = all;
  return m;
}

#ifdef BATON_HAVE_CUDA_HEADERS
int RunSteps(const Flags& f, const CudaDriver& cu, json& result) {
  Result<PrimaryContext> ctx = PrimaryContext::Retain(cu, f.device);
  if (!ctx.ok()) {
    result["ok"] = false;
    result["error"] = ctx.status().ToString();
    return 1;
  }
  GpuCheckOptions o{.device = f.device,
                    .out_dir = f.out,
                    .weight_gib = f.weight_gib,
                    .weight_chunk_mib = f.weight_chunk_mib,
                    .pool_gib = f.pool_gib,
                    .pool_chunk_mib = f.pool_chunk_mib,
                    .remat_gib = f.remat_gib,
                    .remat_streams = f.remat_streams,
                    .remat_chunk_mib = f.remat_chunk_mib,
                    .reps = f.reps,
                    .drill_runs = f.drill_runs,
                    .peer_command = {SelfExePath(), "--drill-peer"}};
  result["device"] = DeviceInfo(*ctx);
  Finished(result, "start");
  bool ok = true;
  if (f.Runs("remat")) {
    g_step = "rematerialization";
    result["remat"] = RematStep(*ctx, o);
    ok = result["remat"].value("ok", false) && result["remat"].value("ratio", 0.0) >= 0.9;
    Finished(result, "remat");
  }
  json promotions = json::array();
  for (uint64_t w : f.Runs("drill") ? f.weight_gib : std::vector<uint64_t>{}) {
    g_step = w <= 16 ? "promotion drill (small weight set)" : "promotion drill (large weight set)";
    json d = DrillStep(*ctx, o, w);
    ok = ok && d.value("ok", false) && d.value("promotion_ms_max", 1e9) <= 1000.0;
    promotions.push_back(std::move(d));
    result["promotion"] = promotions;
    Finished(result, "drill_" + std::to_string(w) + "gib");
  }
  result["promotion"] = promotions;
  PairStepOptions pair;
  pair.bin_dir = SelfExeDir();
  pair.work_dir = f.out;
  pair.device = f.device;
  pair.failovers = f.failovers;
  if (f.Runs("pair")) {
    g_step = "controller pair on the device";
    result["pair"] = PairStep(pair);
    ok = ok && result["pair"].value("ok", false);
    Finished(result, "pair");
  }
  if (f.Runs("torch") && f.torch_engine.empty()) {
    result["torch"] = json{{"skipped", "no --torch-engine"}};
  } else if (f.Runs("torch")) {
    g_step = "PyTorch engines on the C ABI";
    PairStepOptions torch = pair;
    torch.failovers = f.torch_failovers;
    torch.expect_torch = f.expect_torch;
    torch.model_dir = StepModel(pair.bin_dir, f.out, f.restart_model, f.restart_dtype);
    result["torch"] = torch.model_dir.empty()
                          ? json{{"ok", false}, {"error", "baton-mkmodel failed; see its log"}}
                          : TorchStep(torch, f.torch_engine);
    result["torch"]["model"] = f.restart_model + " " + f.restart_dtype;
    ok = ok && result["torch"].value("ok", false);
    Finished(result, "torch");
  }
  RestartStepOptions restart{.bin_dir = pair.bin_dir,
                             .work_dir = f.out,
                             .device = f.device,
                             .preset = f.restart_model,
                             .dtype = f.restart_dtype,
                             .ready_target_ms = f.restart_ready_ms,
                             .hang_timeout_ms = f.registration_hang_ms};
  if (f.Runs("restart")) {
    g_step = "controller restarts on the device";
    result["restart"] = RestartStep(restart);
    ok = ok && result["restart"].value("ok", false);
    Finished(result, "restart");
  }
  if (f.Runs("registration")) {
    g_step = "registration on a 4 KiB-page arena";
    result["registration"] = RegistrationStep(restart);
    ok = ok && result["registration"].value("ok", false);
    Finished(result, "registration");
  }
  result["targets"] = json{{"promotion_ms_max", 1000},
                           {"promotion_ms_aim", 250},
                           {"remat_ratio_min", 0.9},
                           {"restart_ready_ms_max", f.restart_ready_ms},
                           {"drill_promotion_ms", kDrillPromotionTargetMs},
                           {"torch_ready_ms_p50", 10},
                           {"torch_ready_ms_p99", 25}};
  result["meets_targets"] = MeetsTargets(result);
  result["ok"] = ok && result["unit_tests"].value("ok", true);
  return ok ? 0 : 1;
}
#endif

int Run(const Flags& f) {
  ::mkdir(f.out.c_str(), 0755);
  g_out_file = f.out + "/gpu_check.json";
  StartWatchdog(f.deadline_s);
  const auto start = std::chrono::steady_clock::now();
  g_step_start = start;
  json result{{"gpu", false}, {"unit_tests", UnitTests(f.unit_tests)}};
  Result<BackendChoice> backend =
      ChooseMemoryBackend({.mode = BackendMode::kAuto, .device = f.device});
  const std::string line = backend.ok() ? backend->LogLine() : backend.status().ToString();
  BATON_LOG(INFO, "gpu-check") << line;
  result["backend"] = line;
  Snapshot(result);
  int rc = 0;
#ifdef BATON_HAVE_CUDA_HEADERS
  Result<const CudaDriver*> cu = CudaDriver::Get();
  if (!cu.ok() || (*cu)->device_count() == 0) {
    result["reason"] = !cu.ok() ? cu.status().message() : "the driver sees no CUDA device";
  } else if (!backend.ok() || backend->kind != MemoryBackendKind::kCuda) {
    result["gpu"] = true;
    result["ok"] = false;
    result["reason"] = backend.ok() ? backend->reason : backend.status().message();
    rc = 1;
  } else {
    result["gpu"] = true;
    rc = RunSteps(f, **cu, result);
  }
#else
  result["reason"] = "CUDA backend not compiled (built without the CUDA toolkit headers)";
#endif
  result["elapsed_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Emit(result);
  return rc;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--drill-peer") {
#ifdef BATON_HAVE_CUDA_HEADERS
    return baton::RunDrillPeer(std::vector<std::string>(argv + 2, argv + argc));
#else
    return 2;
#endif
  }
  baton::Flags flags;
  if (std::string error = baton::ParseFlags(argc, argv, &flags); error == "help") {
    std::fputs(baton::kUsage, stdout);
    return 0;
  } else if (!error.empty()) {
    std::fprintf(stderr, "baton-perf-gpu-check: %s\n%s", error.c_str(), baton::kUsage);
    return 2;
  }
  if (const int started = baton::perf::StartPerfRun("baton-perf-gpu-check", argc, argv);
      started != 0) {
    return started;
  }
  return baton::Run(flags);
}
