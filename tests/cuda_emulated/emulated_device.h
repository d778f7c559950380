// Every test of this binary runs on the fake driver's emulated device: before main() the
// process (and every process it starts: the controller and its engines inherit the
// environment) is pointed at the fake libcuda in "vmm" mode and at its NVML
// (tests/cuda/fake_cuda_vmm.cc).
#pragma once

#include <stdlib.h>

namespace baton::testing {

inline const bool kEmulatedDevice = [] {
  ::setenv("BATON_CUDA_LIBRARY", BATON_FAKE_CUDA_DRIVER, 1);
  ::setenv("BATON_FAKE_CUDA", "vmm", 1);
  ::setenv("BATON_NVML_LIBRARY", BATON_FAKE_CUDA_DRIVER, 1);  // its NVML lists no process
  return true;
}();

}  // namespace baton::testing
