// PairStep of perf/gpu_check: the CUDA backend through the real daemon on this GPU.
//
// In DIR/pair: baton-mkmodel writes the tiny model (or `model_dir` is used); baton-controller
// runs with
// `[gpu] backend = "cuda"` and two baton_test_engine_helper engines with --device-memory
// (each checks its device copy of the weights against the arena and stamps its blocks'
// headers in the device pool through the driver); once the pair is ready the primary gets
// SIGKILL and the standby is promoted onto the device pool's promotion reserve (a chunk of
// its own) without waiting for the dead context's teardown; that is done `failovers` times,
// each once the new standby is ready, the dead primary's blocks have left quarantine and the
// promotion reserve is whole again (`drained`, `reserve_available`). The
// JSON carries the controller's device memory (`batonctl status`), each engine's
// `device_memory`, each failover's phases from `batonctl timeline` (`failovers`) with
// `ready_ms` and `teardown_ms` (detected -> its barrier passed) side by side, their p50
// (`ready_ms`, `teardown_ms`), p99 and max, `promoted_before_barrier` (every one), the last
// failover's whole timeline, the violation files the engines wrote (a header left by a dead
// primary), the controller's invariant check, and "ok". Every wait has a deadline;
// the controller is stopped (SIGTERM, then SIGKILL) on every path. Then ("canary"): an
// upgrade to the same command runs a canary beside the new primary on the device pool (the
// pool in 16 MiB chunks, so each gets whole chunks of its own) until both have stamped their
// blocks, and is rolled back; the JSON has each side's blocks and extents, the invariant
// check during and after, the violation files and the outcome. Needs no CUDA header:
// the controller and the engines talk to the driver. Blocking.
//
// With another engine command (TorchStep: perf/gpu/gpu_check_torch_engine.py, PyTorch on the C
// ABI), each engine that is promoted writes DIR/<name>/reports/engine-<id>.json; before each
// kill the step waits for the primary's, after the last failover for all of them (the first
// primary's and each promoted standby's), puts them in the JSON as "engines", and each must
// say "ok".
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace baton {

struct PairStepOptions {
  std::string bin_dir;   // where baton-controller, batonctl, the test engine and mkmodel are
  std::string work_dir;  // DIR/pair is made inside
  int device = 0;
  int timeout_s = 60;         // for the pair to form, and again for the failover
  std::string name = "pair";  // the folder in work_dir
  // The engines' command; empty: the test engine with --device-memory. "{dir}" in an
  // argument becomes the step's folder.
  std::vector<std::string> engine_command;
  int reports = 0;             // > 0: each promoted engine writes a report (the torch engine)
  bool expect_torch = false;   // each report must say it computed with PyTorch ("torch")
  int promote_timeout_ms = 0;  // > 0: the controller's engine.promote_timeout_ms
  std::string model_dir;       // the model; empty: the tiny preset, written into DIR/model
  int failovers = 1;           // kill -9 of the primary, this many times in a row
  // > 0: the targets for the failovers' ready_ms, p50 and p99 (`meets_targets`; a missed
  // target does not fail the step).
  double ready_p50_target_ms = 0;
  double ready_p99_target_ms = 0;
};

nlohmann::json PairStep(const PairStepOptions& options);

// PairStep with perf/gpu/gpu_check_torch_engine.py (at `script`) as the engines, run by python3
// with the project's libraries in bin_dir/../lib. The engines use PyTorch on the GPU where
// it imports, the C ABI alone elsewhere. Its targets: ready_ms p50 at most 10 ms and p99 at
// most 25 ms (on a GPU run with the 4.3 GB model and 10 failovers).
nlohmann::json TorchStep(PairStepOptions options, const std::string& script);

}  // namespace baton
