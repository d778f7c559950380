// The SDK's NCCL watcher on a real communicator: a one-rank communicator on device 0, polled
// through the real libnccl and aborted on fence. Skipped without a GPU or without libnccl.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/driver/dl_library.h"
#include "cuda/nccl/nccl_library.h"
#include "cuda/nccl/nccl_watcher.h"
#include "tests/cuda/cuda_test_util.h"

#ifdef BATON_HAVE_CUDA_HEADERS

namespace baton {
namespace {

// ncclCommInitAll(comm*, ndev, devlist): a communicator of `ndev` ranks in this process.
using CommInitAllFn = int (*)(NcclComm*, int, const int*);

TEST(NcclGpuTest, ARealCommunicatorIsPolledThenAbortedOnFence) {
  BATON_CUDA_OR_SKIP(ctx);
  if (::getenv("BATON_FAKE_CUDA") != nullptr) GTEST_SKIP() << "NCCL needs the real driver";
  Result<const NcclLibrary*> nccl = NcclLibrary::Get();
  if (!nccl.ok()) GTEST_SKIP() << "no NCCL: " << nccl.status().message();
  Result<DlLibrary> lib = DlLibrary::Open("libnccl.so.2");
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  auto init_all = reinterpret_cast<CommInitAllFn>(lib->Symbol("ncclCommInitAll"));
  ASSERT_NE(init_all, nullptr);
  NcclComm comm = nullptr;
  const int devices[] = {ctx.device()};
  const int r = init_all(&comm, 1, devices);
  ASSERT_EQ(r, kNcclSuccess) << (*nccl)->ErrorString(r);

  std::vector<Status> reports;
  Status fence = OkStatus();
  NcclWatcher w(NcclApi::FromLibrary(**nccl),
                {.report = [&reports](const Status& s) { reports.push_back(s); },
                 .fenced = [&fence] { return fence; },
                 .start_thread = false});
  ASSERT_TRUE(w.Register(comm, "tp 0").ok());
  for (int i = 0; i < 3; ++i) w.PollOnce();
  EXPECT_TRUE(reports.empty()) << reports.front().ToString();
  EXPECT_EQ(w.watched(), 1u);

  fence = FailedPrecondition("told to stop: stale epoch");
  w.PollOnce();  // ncclCommAbort on the real communicator, which frees it
  EXPECT_EQ(w.aborted(), 1u);
  EXPECT_EQ(w.watched(), 0u);
  EXPECT_TRUE(reports.empty()) << "a fence is not an NCCL error";
}

}  // namespace
}  // namespace baton

#endif  // BATON_HAVE_CUDA_HEADERS
