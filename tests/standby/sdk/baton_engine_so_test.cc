// libbaton_engine.so as a foreign runtime sees it: loaded with dlopen(), functions found by
// name with dlsym(), and nothing exported but the baton_engine_* C ABI (nm -D).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "standby/sdk/baton_engine.h"

namespace baton::testing {
namespace {

const std::string kLibrary = std::string(BATON_BIN_DIR) + "/../lib/libbaton_engine.so";

class EngineSharedLibrary : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = ::dlopen(kLibrary.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << "dlopen " << kLibrary << ": " << ::dlerror();
  }
  void TearDown() override {
    if (handle_ != nullptr) ::dlclose(handle_);
  }

  // The exported function `name`, checked to come from the shared library itself.
  template <typename Fn>
  Fn* Symbol(const char* name) {
    void* sym = ::dlsym(handle_, name);
    EXPECT_NE(sym, nullptr) << name << ": " << ::dlerror();
    if (sym == nullptr) return nullptr;
    Dl_info info{};
    EXPECT_NE(::dladdr(sym, &info), 0);
    EXPECT_NE(std::string(info.dli_fname != nullptr ? info.dli_fname : "").find("libbaton_engine"),
              std::string::npos)
        << name << " resolved to " << (info.dli_fname != nullptr ? info.dli_fname : "?");
    return reinterpret_cast<Fn*>(sym);
  }

  void* handle_ = nullptr;
};

TEST_F(EngineSharedLibrary, ReportsItsAbiVersion) {
  auto* version = Symbol<int()>("baton_engine_abi_version");
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(version(), BATON_ENGINE_ABI_VERSION);
}

TEST_F(EngineSharedLibrary, ConnectToAMissingSocketFailsWithACode) {
  auto* connect = Symbol<int(const baton_engine_options*, baton_engine**)>("baton_engine_connect");
  auto* last_error = Symbol<const char*()>("baton_engine_last_error");
  ASSERT_NE(connect, nullptr);
  ASSERT_NE(last_error, nullptr);

  baton_engine_options options{};
  options.socket_path = "/nonexistent/baton-so-test/controller.sock";
  options.launch_token = "00000000000000000000000000000000";
  options.engine_id = 1;
  options.connect_timeout_ms = 100;
  baton_engine* engine = reinterpret_cast<baton_engine*>(&options);  // must be reset to NULL
  const int rc = connect(&options, &engine);
  EXPECT_GT(rc, 0);
  EXPECT_EQ(engine, nullptr);
  EXPECT_NE(std::string(last_error()).find("/nonexistent/baton-so-test/controller.sock"),
            std::string::npos)
      << last_error();

  EXPECT_EQ(connect(&options, nullptr), 1);  // invalid argument
  EXPECT_NE(std::string(last_error()).find("out is NULL"), std::string::npos) << last_error();
}

TEST(EngineSharedLibraryExports, OnlyTheCAbiIsExported) {
  const std::string cmd = "nm -D --defined-only " + kLibrary + " 2>&1";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  ASSERT_EQ(::pclose(pipe), 0) << cmd << ":\n" << out;

  std::istringstream lines(out);
  std::string line;
  std::vector<std::string> names;
  while (std::getline(lines, line)) {
    const std::string name = line.substr(line.rfind(' ') + 1);
    names.push_back(name);
    EXPECT_EQ(name.rfind("baton_engine_", 0), 0u) << "exported beyond the C ABI: " << line;
  }
  for (const char* want : {"baton_engine_abi_version", "baton_engine_connect", "baton_engine_close",
                           "baton_engine_next_event"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want << "\n" << out;
  }
}

}  // namespace
}  // namespace baton::testing
