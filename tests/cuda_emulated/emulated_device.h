// Every test of this binary runs on the fake driver's emulated device: before main() the
// process (and every process it starts: the controller and its engines inherit the
// environment) is pointed at the fake libcuda in "vmm" mode (tests/cuda/fake_cuda_vmm.cc).
#pragma once

#include <stdlib.h>

namespace baton::testing {

inline const bool kEmulatedDevice = [] {
  ::setenv("BATON_CUDA_LIBRARY", BATON_FAKE_CUDA_DRIVER, 1);
  ::setenv("BATON_FAKE_CUDA", "vmm", 1);
  return true;
}();

}  // namespace baton::testing
