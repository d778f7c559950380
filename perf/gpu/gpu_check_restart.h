// Two steps of perf/gpu_check with the real daemon on the device and the test engines
// (baton_test_engine_helper --device-memory), on one model written into WORK/model-PRESET-DTYPE
// by baton-mkmodel (kept for both steps; a GPU run uses the 4g preset in bf16, 4.3 GB):
//   RestartStep       baton-controller killed with kill -9 `restarts` times and started again
//                     at once: each time the device weights and pool must be adopted from
//                     baton-keeper with 0 bytes copied, the same engine pids re-adopted and the
//                     pair ready within `ready_target_ms` of the new controller's start (its
//                     own readopt_ms, counted from its start; the polled spawn-to-ready time is
//                     reported beside it); then a kill -9 of the primary must still fail over.
//   RegistrationStep  the weight arena on 4 KiB pages (model.huge_pages = false), a 128 MiB
//                     pool, and a tight hang timeout (`hang_timeout_ms`: heartbeats every
//                     50 ms, 2 missed, and a probe of the rest; 200 ms by default, more for
//                     a test machine loaded by other work): the pair must start
//                     with no engine fenced as hung while it maps and pre-faults the arena,
//                     and fail over after kill -9 of the primary, the new standby registering
//                     on the same arena again. The longest pre-fault is reported against the
//                     hang timeout (`prefault_past_hang_timeout`).
// Each returns a JSON object with "ok" (and "error" when it fails); the controller is stopped on
// every path. Needs no CUDA header. Blocking.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace baton {

struct RestartStepOptions {
  std::string bin_dir;   // baton-controller, batonctl, baton-keeper, the test engine, mkmodel
  std::string work_dir;  // WORK: the model and each step's folder are made inside
  int device = 0;
  std::string preset = "4g";  // baton-mkmodel's preset and dtype of the model
  std::string dtype = "bf16";
  int restarts = 3;
  double ready_target_ms = 50;  // a restarted controller's pair ready within this of its start
  int timeout_s = 300;          // for the first pair (the model loaded and copied) and each wait
  int hang_timeout_ms = 200;    // RegistrationStep's: 50 ms x 2 heartbeats + the probe (> 100)
};

nlohmann::json RestartStep(const RestartStepOptions& options);
nlohmann::json RegistrationStep(const RestartStepOptions& options);

}  // namespace baton
