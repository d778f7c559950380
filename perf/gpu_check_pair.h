// PairStep of perf/gpu_check: the CUDA backend through the real daemon on this GPU.
//
// In DIR/pair: baton-mkmodel writes the tiny model; baton-controller runs with
// `[gpu] backend = "cuda"` and two baton_test_engine_helper engines with --device-memory
// (each checks its device copy of the weights against the arena and stamps its blocks'
// headers in the device pool through the driver); once the pair is ready the primary gets
// SIGKILL and the standby is promoted onto the device pool. The JSON carries the controller's
// device memory (`batonctl status`), each engine's `device_memory`, the failover timeline's
// phases from `batonctl timeline`, the violation files the engines wrote (a header left by
// the dead primary), the controller's invariant check, and "ok". Every wait has a deadline;
// the controller is stopped (SIGTERM, then SIGKILL) on every path. Needs no CUDA header:
// the controller and the engines talk to the driver. Blocking.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace baton {

struct PairStepOptions {
  std::string bin_dir;   // where baton-controller, batonctl, the test engine and mkmodel are
  std::string work_dir;  // DIR/pair is made inside
  int device = 0;
  int timeout_s = 60;  // for the pair to form, and again for the failover
};

nlohmann::json PairStep(const PairStepOptions& options);

}  // namespace baton
