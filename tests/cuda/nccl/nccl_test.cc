// libnccl through dlopen (the real library where it is installed) and the SDK's NCCL
// watcher, driven through NcclApi with communicators the test controls.
#include <gtest/gtest.h>

#include <map>
#include <thread>
#include <vector>

#include "cuda/nccl/nccl_library.h"
#include "cuda/nccl/nccl_watcher.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

TEST(NcclLibraryTest, MissingLibraryIsUnavailable) {
  Result<std::unique_ptr<NcclLibrary>> nccl = NcclLibrary::Load("libbaton-no-nccl.so.2");
  ASSERT_FALSE(nccl.ok());
  EXPECT_EQ(nccl.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(nccl.status().message().rfind("libbaton-no-nccl.so.2: ", 0), 0u);
}

TEST(NcclLibraryTest, RealLibraryAnswersWithoutAGpu) {
  Result<const NcclLibrary*> nccl = NcclLibrary::Get();
  if (!nccl.ok()) GTEST_SKIP() << "no NCCL: " << nccl.status().message();
  EXPECT_GT((*nccl)->version(), 0);
  EXPECT_NE((*nccl)->version_string(), "0.0.0");
  // ncclUnhandledCudaError (1) has a text in every NCCL release.
  const std::string text = (*nccl)->ErrorString(1);
  EXPECT_EQ(text.rfind("ncclResult 1 (", 0), 0u) << text;
  int result = 0;
  EXPECT_EQ((*nccl)->GetAsyncError(nullptr, &result).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*nccl)->Abort(nullptr).code(), StatusCode::kInvalidArgument);
}

// Communicators as the test says: comm -> the async result its poll returns.
struct FakeNccl {
  std::mutex mu;
  std::map<NcclComm, int> state;
  std::map<NcclComm, bool> poll_fails;
  std::vector<NcclComm> aborted;

  NcclApi Api() {
    return NcclApi{
        .get_async_error =
            [this](NcclComm c, int* r) {
              std::lock_guard<std::mutex> lock(mu);
              if (poll_fails[c]) return Internal("ncclCommGetAsyncError: invalid usage");
              *r = state[c];
              return OkStatus();
            },
        .abort =
            [this](NcclComm c) {
              std::lock_guard<std::mutex> lock(mu);
              aborted.push_back(c);
              return OkStatus();
            },
        .error_string = [](int r) { return "ncclResult " + std::to_string(r) + " (fake)"; },
    };
  }
};

NcclComm Comm(uintptr_t n) { return reinterpret_cast<NcclComm>(n); }

struct Reports {
  std::mutex mu;
  std::vector<Status> seen;
  std::function<void(const Status&)> Sink() {
    return [this](const Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(s);
    };
  }
};

TEST(NcclWatcherTest, ReportsAndAbortsACommunicatorInError) {
  FakeNccl nccl;
  Reports reports;
  NcclWatcher w(nccl.Api(), {.report = reports.Sink(), .start_thread = false});
  ASSERT_TRUE(w.Register(Comm(0x10), "tp 0").ok());
  ASSERT_TRUE(w.Register(Comm(0x20), "tp 1").ok());
  w.PollOnce();
  EXPECT_TRUE(reports.seen.empty());
  nccl.state[Comm(0x20)] = 3;  // ncclInternalError
  w.PollOnce();
  ASSERT_EQ(reports.seen.size(), 1u);
  EXPECT_EQ(reports.seen[0].code(), StatusCode::kUnavailable);
  EXPECT_NE(reports.seen[0].message().find("NCCL communicator tp 1"), std::string::npos);
  EXPECT_NE(reports.seen[0].message().find("asynchronous error ncclResult 3 (fake)"),
            std::string::npos)
      << reports.seen[0].message();
  EXPECT_EQ(nccl.aborted, std::vector<NcclComm>{Comm(0x20)});
  EXPECT_EQ(w.watched(), 1u);
  // Reported once: the aborted communicator is forgotten.
  w.PollOnce();
  EXPECT_EQ(reports.seen.size(), 1u);
  EXPECT_EQ(w.Unregister(Comm(0x20)).code(), StatusCode::kNotFound);
}

TEST(NcclWatcherTest, InProgressIsNotAnError) {
  FakeNccl nccl;
  Reports reports;
  NcclWatcher w(nccl.Api(), {.report = reports.Sink(), .start_thread = false});
  ASSERT_TRUE(w.Register(Comm(0x10), "").ok());
  nccl.state[Comm(0x10)] = kNcclInProgress;
  w.PollOnce();
  EXPECT_TRUE(reports.seen.empty());
  EXPECT_TRUE(nccl.aborted.empty());
}

TEST(NcclWatcherTest, AFailingPollIsReported) {
  FakeNccl nccl;
  Reports reports;
  NcclWatcher w(nccl.Api(), {.report = reports.Sink(), .start_thread = false});
  ASSERT_TRUE(w.Register(Comm(0x10), "dp").ok());
  nccl.poll_fails[Comm(0x10)] = true;
  w.PollOnce();
  ASSERT_EQ(reports.seen.size(), 1u);
  EXPECT_NE(reports.seen[0].message().find("invalid usage"), std::string::npos);
  EXPECT_EQ(nccl.aborted.size(), 1u);
}

TEST(NcclWatcherTest, FenceAbortsEveryCommunicatorOnce) {
  FakeNccl nccl;
  Reports reports;
  Status fence = OkStatus();
  NcclWatcher w(
      nccl.Api(),
      {.report = reports.Sink(), .fenced = [&fence] { return fence; }, .start_thread = false});
  for (uintptr_t c : {1, 2, 3}) ASSERT_TRUE(w.Register(Comm(c), "").ok());
  w.PollOnce();
  EXPECT_TRUE(nccl.aborted.empty());
  fence = FailedPrecondition("told to stop: stale epoch");
  w.PollOnce();
  EXPECT_EQ(nccl.aborted.size(), 3u);
  EXPECT_EQ(w.watched(), 0u);
  EXPECT_TRUE(reports.seen.empty()) << "a fence is not an NCCL error";
  EXPECT_EQ(w.Register(Comm(4), "").code(), StatusCode::kFailedPrecondition);
  w.PollOnce();
  EXPECT_EQ(nccl.aborted.size(), 3u);
}

TEST(NcclWatcherTest, RegistrationRules) {
  FakeNccl nccl;
  NcclWatcher w(nccl.Api(), {.start_thread = false});
  EXPECT_EQ(w.Register(nullptr, "").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.Register(Comm(7), "").ok());
  EXPECT_EQ(w.Register(Comm(7), "").code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(w.Unregister(Comm(7)).ok());
  EXPECT_EQ(w.Unregister(Comm(7)).code(), StatusCode::kNotFound);
  ASSERT_TRUE(w.Register(Comm(8), "").ok());
  w.AbortAll("test");
  EXPECT_EQ(nccl.aborted, std::vector<NcclComm>{Comm(8)});
}

TEST(NcclWatcherTest, ItsThreadPollsAndReports) {
  FakeNccl nccl;
  Reports reports;
  NcclWatcher w(nccl.Api(), {.interval = 1ms, .report = reports.Sink()});
  ASSERT_TRUE(w.Register(Comm(0x10), "tp").ok());
  {
    std::lock_guard<std::mutex> lock(nccl.mu);
    nccl.state[Comm(0x10)] = 2;  // ncclSystemError
  }
  auto reported = [&reports] {
    std::lock_guard<std::mutex> lock(reports.mu);
    return reports.seen.size();
  };
  // The report follows the abort, from the watcher's thread.
  for (int i = 0; i < 5000 && reported() == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(reported(), 1u);
  EXPECT_EQ(w.aborted(), 1u);
  EXPECT_GT(w.polls(), 0u);
}

}  // namespace
}  // namespace baton
