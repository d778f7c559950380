// PairStep of perf/gpu_check: the CUDA backend through the real daemon on this GPU.
//
// In DIR/pair: baton-mkmodel writes the tiny model; baton-controller runs with
// `[gpu] backend = "cuda"` and two baton_test_engine_helper engines with --device-memory
// (each checks its device copy of the weights against the arena and stamps its blocks'
// headers in the device pool through the driver); once the pair is ready the primary gets
// SIGKILL and the standby is promoted onto the device pool's promotion reserve (a chunk of
// its own) without waiting for the dead context's teardown. The JSON carries the controller's
// device memory (`batonctl status`), each engine's `device_memory`, the failover timeline
// from `batonctl timeline` once the dead primary's blocks have left quarantine, with
// `ready_ms` and `teardown_ms` (detected -> its barrier passed) side by side and
// `promoted_before_barrier`, the violation files the engines wrote (a header left by the dead
// primary), the controller's invariant check, and "ok". Every wait has a deadline;
// the controller is stopped (SIGTERM, then SIGKILL) on every path. Then ("canary"): an
// upgrade to the same command runs a canary beside the new primary on the device pool (the
// pool in 16 MiB chunks, so each gets whole chunks of its own) until both have stamped their
// blocks, and is rolled back; the JSON has each side's blocks and extents, the invariant
// check during and after, the violation files and the outcome. Needs no CUDA header:
// the controller and the engines talk to the driver. Blocking.
//
// With another engine command (TorchStep: perf/gpu/gpu_check_torch_engine.py, PyTorch on the C
// ABI), each engine that is promoted writes DIR/<name>/reports/engine-<id>.json; the step
// waits for `reports` of them after the failover (the first primary's and the promoted
// standby's), puts them in the JSON as "engines", and each must say "ok".
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
  int reports = 0;             // engine reports to wait for after the failover
  int promote_timeout_ms = 0;  // > 0: the controller's engine.promote_timeout_ms
};

nlohmann::json PairStep(const PairStepOptions& options);

// PairStep with perf/gpu/gpu_check_torch_engine.py (at `script`) as the engines, run by python3
// with the project's libraries in bin_dir/../lib. The engines use PyTorch on the GPU where
// it imports, the C ABI alone elsewhere.
nlohmann::json TorchStep(PairStepOptions options, const std::string& script);

}  // namespace baton
