#include "base/io/self_exe.h"

#include <filesystem>

namespace baton {

std::string SelfExePath() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::canonical("/proc/self/exe", ec);
  return ec ? "/proc/self/exe" : self.string();
}

std::string SelfExeDir() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::canonical("/proc/self/exe", ec);
  return ec ? "" : self.parent_path().string();
}

}  // namespace baton
