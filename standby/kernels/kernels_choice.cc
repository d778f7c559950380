#include "standby/kernels/kernels_choice.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "standby/kernels/kernels.h"
#include "standby/kernels/kernels_gemm.h"

namespace baton {
namespace {

constexpr const char* kVariable = "BATON_CPU_KERNELS";

// The value, read once (the environment may change after): "" when unset.
const std::string& AskedValue() {
  static const std::string value = [] {
    const char* v = std::getenv(kVariable);
    return std::string(v == nullptr ? "" : v);
  }();
  return value;
}

}  // namespace

KernelsAsked ParseKernelsAsked(const char* value) {
  const std::string_view v = value == nullptr ? "" : value;
  if (v.empty() || v == "auto") return KernelsAsked::kBest;
  if (v == "avx2") return KernelsAsked::kAvx2;
  if (v == "portable") return KernelsAsked::kPortable;
  // Before main (a static initialiser): stderr, not the log.
  std::fprintf(stderr, "%s=%.*s is not a kernel choice (auto, avx2 or portable): using auto\n",
               kVariable, static_cast<int>(v.size()), v.data());
  return KernelsAsked::kBest;
}

KernelsAsked KernelsAskedByEnvironment() {
  static const KernelsAsked asked = ParseKernelsAsked(AskedValue().c_str());
  return asked;
}

std::string KernelsInUse() {
  std::string in_use = "portable";
  if (ActiveKernelPath() == KernelPath::kAvx2) {
    in_use = Avx512BlocksInUse() ? "avx2 with avx-512 blocks" : "avx2";
  }
  if (KernelsAskedByEnvironment() != KernelsAsked::kBest) {
    in_use += std::string(" (") + kVariable + "=" + AskedValue() + ")";
  }
  return in_use;
}

}  // namespace baton
