// The engine SDK's GPU calls against a scripted controller (tests/standby/fake_controller.h):
// a sticky CUDA error reaches the controller as an ErrorReport and fences the engine, other
// CUDA errors are only described; and libbaton_engine.so exports the GPU C ABI.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "cuda/nccl/nccl_library.h"
#include "standby/sdk/baton_engine.h"
#include "standby/sdk/engine_sdk.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/standby/fake_controller.h"

namespace baton {
namespace {

using testing::ConnectSession;
using testing::FakeController;

TEST(EngineGpuSdkTest, StickyCudaErrorFencesTheEngine) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 7, .extents = {{0, 1}}}).ok());
  ASSERT_TRUE(s->WaitForPromotion(std::chrono::seconds(5)).ok());

  Status oom = s->ReportCudaError(2, "cudaMalloc of the activations");
  EXPECT_EQ(oom.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << oom.message();
  EXPECT_TRUE(s->CheckEpoch().ok()) << "an out-of-memory error is not sticky";

  Status sticky = s->ReportCudaError(700, "decode step");
  EXPECT_EQ(sticky.code(), StatusCode::kInternal);
  EXPECT_EQ(sticky.message().rfind("decode step: CUDA_ERROR_ILLEGAL_ADDRESS", 0), 0u)
      << sticky.message();
  proto::ErrorReport report = fake.Expect<proto::ErrorReport>();
  EXPECT_EQ(report.epoch, 7u);
  EXPECT_NE(report.message.find("sticky CUDA error: decode step: CUDA_ERROR_ILLEGAL_ADDRESS"),
            std::string::npos)
      << report.message;
  EXPECT_FALSE(s->CheckEpoch().ok());
  EXPECT_TRUE(s->ReportCudaError(0, "nothing").ok());
}

TEST(EngineGpuSdkTest, NcclWatchNeedsACommunicator) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->UnwatchNcclComm(reinterpret_cast<void*>(0x1)).code(), StatusCode::kNotFound);
  Status watched = s->WatchNcclComm(nullptr, "tp");
  if (NcclLibrary::Get().ok()) {
    EXPECT_EQ(watched.code(), StatusCode::kInvalidArgument) << watched.ToString();
  } else {
    EXPECT_EQ(watched.code(), StatusCode::kUnavailable) << watched.ToString();
  }
  s->Shutdown();  // stops the watcher before the session goes
}

TEST(EngineGpuSdkTest, SharedLibraryExportsTheGpuCalls) {
  const std::string lib = testing::LibDir() + "/libbaton_engine.so";
  void* handle = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << ::dlerror();
  for (const char* name : {"baton_engine_register_nccl_comm", "baton_engine_unregister_nccl_comm",
                           "baton_engine_report_cuda_error"}) {
    EXPECT_NE(::dlsym(handle, name), nullptr) << name;
  }
  EXPECT_EQ(::dlsym(handle, "_ZN5baton11NcclWatcher8PollOnceEv"), nullptr)
      << "the SDK's C++ symbols stay hidden";
  using ReportFn = int (*)(baton_engine*, int, const char*);
  auto report = reinterpret_cast<ReportFn>(::dlsym(handle, "baton_engine_report_cuda_error"));
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report(nullptr, 700, "x"), 1) << "a NULL engine is a bad argument";
  ::dlclose(handle);
}

}  // namespace
}  // namespace baton
