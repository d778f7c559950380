// The engine SDK against an in-process fake controller speaking the real protocol.
#include "standby/sdk/engine_sdk.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "proto/transport/liveness_page.h"
#include "tests/standby/fake_controller.h"
#include "tests/standby/sdk/mappings_testutil.h"
#include "tests/weightcache/io/pinned_arena_testutil.h"

namespace baton::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// 18 blocks in chunks of 4 (the last, [16, 18), short): whole chunks from the highest, each
// only if it fits in what is left, and only those `take` gives up.
TEST(EngineSdk, TakeWholeChunksOffersChunksFromTheHighestThatFit) {
  std::vector<std::pair<uint32_t, uint32_t>> offered;
  auto all_but_8 = [&](uint32_t first, uint32_t end) {
    offered.emplace_back(first, end);
    return first != 8;  // a sequence holds a block of [8, 12)
  };
  EXPECT_EQ(TakeWholeChunks(18, 4, 11, all_but_8), 10u);
  EXPECT_EQ(offered,
            (std::vector<std::pair<uint32_t, uint32_t>>{{16, 18}, {12, 16}, {8, 12}, {4, 8}}))
      << "[0, 4) does not fit in the 1 block left";
  offered.clear();
  EXPECT_EQ(TakeWholeChunks(18, 1, 3, all_but_8), 3u);
  EXPECT_EQ(offered, (std::vector<std::pair<uint32_t, uint32_t>>{{17, 18}, {16, 17}, {15, 16}}));
  EXPECT_EQ(TakeWholeChunks(18, 4, 0, all_but_8), 0u);
  EXPECT_EQ(TakeWholeChunks(0, 4, 5, all_but_8), 0u);
}

TEST(EngineSdk, RegistersAsAHalfStartedStandby) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 100);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->engine_id(), kEngineId);
  const MappedWeights& w = s->weights();
  ASSERT_EQ(w.tensors.size(), 2u);
  const MappedTensor* b = w.Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kU8);
  EXPECT_EQ(b->size, 100u);
  EXPECT_EQ(b->data[1], static_cast<uint8_t>(4097 * 7));
  EXPECT_EQ(w.Find("missing"), nullptr);
  // Weights are mapped read-only; the pool range is reserved and maps nothing writable.
  const std::vector<std::string> arena = MappingsIn(w.base, w.size);
  ASSERT_FALSE(arena.empty());
  EXPECT_FALSE(AnyWritable(arena));
  const PoolView& pool = s->pool();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.base) % kHugePageSize, 0u);
  EXPECT_GE(pool.reserved_bytes, kFakeBlocks * kFakeBlockBytes);
  EXPECT_FALSE(AnyWritable(MappingsIn(pool.base, pool.reserved_bytes))) << "rule 5";
  EXPECT_EQ(s->epoch(), 0u);
  EXPECT_TRUE(s->CheckEpoch().ok());
  EXPECT_TRUE(s->extents().empty());
}

TEST(EngineSdk, HeartbeatsComeFromItsOwnThreadAndHealthRequestsAreAnsweredAtOnce) {
  FakeController fake;
  // One heartbeat a minute: any heartbeat after the first answers the health request.
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 60'000);
  ASSERT_NE(s, nullptr);
  // The thread's first heartbeat may come before StandbyReady, where the registration
  // counted it, or after.
  proto::Heartbeat first =
      fake.heartbeats() > 0 ? fake.last_heartbeat() : fake.Expect<proto::Heartbeat>();
  EXPECT_EQ(first.epoch, 0u);
  ASSERT_TRUE(fake.channel().Send(proto::HealthRequest{.seq = 1}).ok());
  proto::Heartbeat answer = fake.Expect<proto::Heartbeat>(seconds(10));
  EXPECT_GT(answer.seq, first.seq);
}

// The heartbeat thread holds the liveness page's mutex from before StandbyReady, which
// carries the page, until the session shuts down; a watch on it then ends with no death.
TEST(EngineSdk, TheHeartbeatThreadHoldsTheLivenessPageThatStandbyReadySends) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 100);
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(fake.last_fds().size(), 1u) << "StandbyReady carries the liveness page";
  const int fd = fake.last_fds()[0].get();
  EXPECT_EQ(::fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
  void* p = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  const auto* word = static_cast<const uint32_t*>(p);
  const pid_t holder = static_cast<pid_t>(__atomic_load_n(word, __ATOMIC_SEQ_CST) & FUTEX_TID_MASK);
  EXPECT_NE(holder, 0) << "the mutex is held";
  EXPECT_NE(holder, ::gettid()) << "by the heartbeat thread, not the caller's";
  EXPECT_TRUE(std::filesystem::exists("/proc/self/task/" + std::to_string(holder)));
  std::unique_ptr<proto::LivenessWatch> watch =
      Take(proto::LivenessWatch::Start(UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0))));
  // The watch has seen the holder once it marked itself a waiter (FUTEX_WAITERS).
  for (int i = 0; i < 1000 && (__atomic_load_n(word, __ATOMIC_SEQ_CST) & FUTEX_WAITERS) == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  s.reset();
  EXPECT_EQ(__atomic_load_n(word, __ATOMIC_SEQ_CST) & FUTEX_TID_MASK, 0u) << "released at shutdown";
  for (int i = 0; i < 1000 && !watch->finished(); ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(watch->finished());
  pollfd dead{.fd = watch->fd(), .events = POLLIN, .revents = 0};
  EXPECT_EQ(::poll(&dead, 1, 0), 0) << "a shutdown is no death";
  ::munmap(p, 4096);
}

// ready_when_waiting: Connect() returns with the weights mapped and no StandbyReady sent (the
// engine builds its model meanwhile, heartbeating); its first WaitForPromotion() sends it,
// with the liveness page, and no later one sends it again.
TEST(EngineSdk, AStandbyReadyWhenWaitingSaysSoAtItsFirstWaitForPromotion) {
  FakeController fake;
  EngineSessionOptions options = fake.Options();
  options.ready_when_waiting = true;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50, options);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(fake.NextWithin(milliseconds(300)), std::nullopt) << "not ready before it waits";
  // Heartbeats meanwhile. A descheduled session thread may have sent none yet: then its next
  // message must be one (Expect fails on a StandbyReady).
  if (fake.heartbeats() == 0) (void)fake.Expect<proto::Heartbeat>(seconds(30));
  EXPECT_EQ(s->WaitForPromotion(milliseconds(10)).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(fake.NextWithin(seconds(30)), proto::MsgType::kStandbyReady);
  EXPECT_EQ(fake.last_fds().size(), 1u) << "StandbyReady carries the liveness page";
  EXPECT_EQ(s->WaitForPromotion(milliseconds(10)).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(fake.NextWithin(milliseconds(200)), std::nullopt) << "sent once";
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 2, .extents = {{0, 1}}}).ok());
  EXPECT_TRUE(s->WaitForPromotion(milliseconds(10000)).ok());
}

// A controller lost before such a standby waited never counted it a standby: the session ends
// (no reattach as a standby it never was), and the wait says so.
TEST(EngineSdk, AStandbyNotYetReadyEndsWithItsLostController) {
  FakeController fake;
  EngineSessionOptions options = fake.ReattachingOptions();
  options.ready_when_waiting = true;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50, options);
  ASSERT_NE(s, nullptr);
  fake.GoAway();
  std::optional<SessionEvent> event = s->NextEvent(milliseconds(10000));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->kind, SessionEventKind::kDisconnected);
  EXPECT_EQ(s->WaitForPromotion(milliseconds(10000)).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(EngineSdk, PromotionMapsExtentsWritableAndScrubsTheirHeaders) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  std::memset(fake.block(1), 0xAB, kFakeBlockBytes);  // a previous holder's leftovers
  std::memset(fake.block(2), 0xAB, kFakeBlockBytes);
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 7, .extents = {{1, 2}}}).ok());
  Result<SessionEvent> promoted = s->WaitForPromotion(seconds(30));
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  ASSERT_EQ(promoted->extents.size(), 1u);
  const MappedExtent& e = promoted->extents[0];
  EXPECT_EQ(e.first, 1u);
  EXPECT_EQ(e.count, 2u);
  EXPECT_EQ(e.data, s->pool().BlockData(1));
  EXPECT_EQ(e.bytes, 2 * kFakeBlockBytes);
  EXPECT_EQ(s->epoch(), 7u);
  for (uint32_t b : {1u, 2u}) {
    for (uint64_t i = 0; i < kBlockHeaderBytes; ++i) ASSERT_EQ(fake.block(b)[i], 0) << b;
    EXPECT_EQ(fake.block(b)[kBlockHeaderBytes], 0xAB) << "only the header is scrubbed";
  }
  e.data[100] = 0x5A;  // shared with the controller's mapping
  EXPECT_EQ(fake.block(1)[100], 0x5A);
  EXPECT_FALSE(AnyWritable(MappingsIn(s->pool().BlockData(0), kFakeBlockBytes)));
  ASSERT_TRUE(s->MarkServing().ok());
  proto::PromoteAck ack = fake.Expect<proto::PromoteAck>();
  EXPECT_EQ(ack.epoch, 7u);
  EXPECT_EQ(ack.blocks_mapped, 2u);
  EXPECT_EQ(fake.Expect<proto::Heartbeat>().epoch, 7u);
}

TEST(EngineSdk, GrantsReturnsAndRefusals) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->MarkServing().ok()) << "not promoted yet";
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 3, .extents = {{0, 2}}}).ok());
  ASSERT_TRUE(s->WaitForPromotion(seconds(30)).ok());
  ASSERT_TRUE(fake.channel().Send(proto::Grant{.epoch = 3, .extents = {{2, 2}}}).ok());
  std::optional<SessionEvent> granted = s->NextEvent(seconds(30));
  ASSERT_TRUE(granted.has_value());
  EXPECT_EQ(granted->kind, SessionEventKind::kGranted);
  ASSERT_EQ(s->extents().size(), 1u) << "adjacent extents coalesce";
  EXPECT_EQ(s->extents()[0].count, 4u);

  // A grant at another epoch is refused and maps nothing.
  ASSERT_TRUE(fake.channel().Send(proto::Grant{.epoch = 4, .extents = {{6, 1}}}).ok());
  proto::ErrorMsg refused = fake.Expect<proto::ErrorMsg>();
  EXPECT_NE(refused.message.find("epoch 4"), std::string::npos) << refused.message;
  EXPECT_FALSE(AnyWritable(MappingsIn(s->pool().BlockData(6), kFakeBlockBytes)));

  ASSERT_TRUE(s->RequestBlocks(2).ok());
  proto::LeaseRequest lease = fake.Expect<proto::LeaseRequest>();
  EXPECT_EQ(lease.epoch, 3u);
  EXPECT_EQ(lease.blocks, 2u);

  const MappedExtent give{.first = 3, .count = 1};
  ASSERT_TRUE(s->ReturnBlocks(std::span<const MappedExtent>(&give, 1)).ok());
  proto::ReturnExtents ret = fake.Expect<proto::ReturnExtents>();
  EXPECT_EQ(ret.epoch, 3u);
  ASSERT_EQ(ret.extents.size(), 1u);
  EXPECT_EQ(ret.extents[0], (proto::BlockRange{3, 1}));
  EXPECT_FALSE(AnyWritable(MappingsIn(s->pool().BlockData(3), kFakeBlockBytes)));
  EXPECT_FALSE(s->ReturnBlocks(std::span<const MappedExtent>(&give, 1)).ok()) << "not mapped";

  ASSERT_TRUE(fake.channel().Send(proto::Reclaim{.epoch = 3, .blocks = 1}).ok());
  std::optional<SessionEvent> reclaim = s->NextEvent(seconds(30));
  ASSERT_TRUE(reclaim.has_value());
  EXPECT_EQ(reclaim->kind, SessionEventKind::kReclaim);
  EXPECT_EQ(reclaim->blocks, 1u);
}

// A list with a block listed twice (or one not mapped) is refused whole: nothing is unmapped
// and nothing sent, so the controller's ledger and the engine's mappings stay in step.
TEST(EngineSdk, AReturnListThatCannotBeDoneWholeUnmapsNothing) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 3, .extents = {{0, 8}}}).ok());
  ASSERT_TRUE(s->WaitForPromotion(seconds(30)).ok());
  const MappedExtent twice[] = {{.first = 0, .count = 4}, {.first = 0, .count = 4}};
  Status refused = s->ReturnBlocks(twice);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  const MappedExtent outside[] = {{.first = 2, .count = 2}, {.first = 6, .count = 4}};
  EXPECT_FALSE(s->ReturnBlocks(outside).ok()) << "blocks 8 and 9 are not mapped";
  const MappedExtent empty_extent[] = {{.first = 1, .count = 0}};
  EXPECT_FALSE(s->ReturnBlocks(empty_extent).ok());
  EXPECT_TRUE(AnyWritable(MappingsIn(s->pool().BlockData(0), kFakeBlockBytes)));
  EXPECT_TRUE(AnyWritable(MappingsIn(s->pool().BlockData(2), kFakeBlockBytes)));
  ASSERT_EQ(s->extents().size(), 1u);
  EXPECT_EQ(s->extents()[0].count, 8u);

  const MappedExtent split[] = {{.first = 4, .count = 2}, {.first = 1, .count = 1}};
  ASSERT_TRUE(s->ReturnBlocks(split).ok());
  proto::ReturnExtents ret = fake.Expect<proto::ReturnExtents>();
  ASSERT_EQ(ret.extents.size(), 2u) << "the refused lists sent nothing";
  EXPECT_EQ(ret.extents[0], (proto::BlockRange{4, 2}));
  EXPECT_EQ(ret.extents[1], (proto::BlockRange{1, 1}));
}

// Shutdown() from another thread (a signal handler's thread, say) wakes a thread blocked
// waiting for promotion or for the next event.
TEST(EngineSdk, ShutdownWakesThreadsThatWait) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  auto promoted = std::async(std::launch::async, [&] { return s->WaitForPromotion(std::nullopt); });
  auto event = std::async(std::launch::async, [&] { return s->NextEvent(std::nullopt); });
  std::this_thread::sleep_for(milliseconds(50));
  s->Shutdown();
  ASSERT_EQ(promoted.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(promoted.get().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(event.wait_for(seconds(10)), std::future_status::ready);
  std::optional<SessionEvent> got = event.get();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->kind, SessionEventKind::kDisconnected);
}

TEST(EngineSdk, ErrorReportStopsTheEngineWriting) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 5, .extents = {{0, 1}}}).ok());
  ASSERT_TRUE(s->WaitForPromotion(seconds(30)).ok());
  ASSERT_TRUE(s->ReportError(DataLoss("sticky device error")).ok());
  proto::ErrorReport report = fake.Expect<proto::ErrorReport>();
  EXPECT_EQ(report.epoch, 5u);
  EXPECT_EQ(report.code, static_cast<uint32_t>(StatusCode::kDataLoss));
  EXPECT_EQ(report.message, "sticky device error");
  EXPECT_FALSE(s->CheckEpoch().ok());
}

TEST(EngineSdk, InjectedFaultIsReportedAsAnError) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::InjectFault{.kind = "error", .message = "drill"}).ok());
  proto::ErrorReport report = fake.Expect<proto::ErrorReport>();
  EXPECT_NE(report.message.find("drill"), std::string::npos);
  EXPECT_FALSE(s->WaitForPromotion(milliseconds(10)).ok());
}

TEST(EngineSdk, StopAndDisconnectAreEvents) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Drain{.epoch = 0, .timeout_ms = 250}).ok());
  std::optional<SessionEvent> drain = s->NextEvent(seconds(30));
  ASSERT_TRUE(drain.has_value());
  EXPECT_EQ(drain->kind, SessionEventKind::kDrain);
  EXPECT_EQ(drain->timeout, milliseconds(250));
  EXPECT_TRUE(drain->successor) << "a Drain has a next primary to hand requests over to";
  ASSERT_TRUE(s->ReportDrained(0).ok());
  EXPECT_EQ(fake.Expect<proto::Drained>().unfinished, 0u);
  ASSERT_TRUE(fake.channel().Send(proto::FinalDrain{.epoch = 0, .timeout_ms = 400}).ok());
  std::optional<SessionEvent> final_drain = s->NextEvent(seconds(30));
  ASSERT_TRUE(final_drain.has_value());
  EXPECT_EQ(final_drain->kind, SessionEventKind::kDrain);
  EXPECT_EQ(final_drain->timeout, milliseconds(400));
  EXPECT_FALSE(final_drain->successor) << "a FinalDrain has none: the engine finishes";
  ASSERT_TRUE(s->ReportDrained(0).ok());
  EXPECT_EQ(fake.Expect<proto::Drained>().unfinished, 0u);
  ASSERT_TRUE(fake.channel().Send(proto::Stop{.reason = "stale epoch"}).ok());
  std::optional<SessionEvent> stop = s->NextEvent(seconds(30));
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->kind, SessionEventKind::kStop);
  EXPECT_EQ(stop->reason, "stale epoch");
  EXPECT_EQ(s->CheckEpoch().code(), StatusCode::kFailedPrecondition);
  Result<SessionEvent> promoted = s->WaitForPromotion(seconds(1));
  EXPECT_EQ(promoted.status().code(), StatusCode::kFailedPrecondition);
  fake.channel().Close();
  std::optional<SessionEvent> gone = s->NextEvent(seconds(30));
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->kind, SessionEventKind::kDisconnected);
  EXPECT_EQ(s->CheckEpoch().code(), StatusCode::kUnavailable);
  s->Shutdown();
  s->Shutdown();  // idempotent
}

// A drain called off: resume_pending() says so as soon as the Resume arrives (an engine
// waiting for its requests stops waiting), until the kResume event is taken.
TEST(EngineSdk, ACalledOffDrainIsAResumeEvent) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Drain{.epoch = 0, .timeout_ms = 60000}).ok());
  std::optional<SessionEvent> drain = s->NextEvent(seconds(30));
  ASSERT_TRUE(drain.has_value());
  EXPECT_EQ(drain->kind, SessionEventKind::kDrain);
  EXPECT_FALSE(s->resume_pending());
  ASSERT_TRUE(fake.channel().Send(proto::Resume{.epoch = 0}).ok());
  for (const auto until = std::chrono::steady_clock::now() + seconds(30);
       !s->resume_pending() && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(s->resume_pending());
  ASSERT_TRUE(s->ReportDrained(3).ok());
  EXPECT_EQ(fake.Expect<proto::Drained>().unfinished, 3u);
  std::optional<SessionEvent> resume = s->NextEvent(seconds(30));
  ASSERT_TRUE(resume.has_value());
  EXPECT_EQ(resume->kind, SessionEventKind::kResume);
  EXPECT_FALSE(s->resume_pending());
  EXPECT_TRUE(s->CheckEpoch().ok()) << "a resumed engine keeps its epoch";
  s->Shutdown();
}

TEST(EngineSdk, ShutdownUnmapsEveryExtent) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 2, .extents = {{0, 8}}}).ok());
  ASSERT_TRUE(s->WaitForPromotion(seconds(30)).ok());
  EXPECT_TRUE(AnyWritable(MappingsIn(s->pool().base, kFakeBlocks * kFakeBlockBytes)));
  uint8_t* base = s->pool().base;
  s->Shutdown();
  EXPECT_FALSE(AnyWritable(MappingsIn(base, kFakeBlocks * kFakeBlockBytes)));
  EXPECT_TRUE(s->extents().empty());
}

TEST(EngineSdk, WrongLaunchTokenIsRefused) {
  FakeController fake;
  auto session = std::async(std::launch::async, [&] {
    return EngineSession::Connect(fake.Options(kEngineId, "not-the-token"));
  });
  fake.ServeRegistration(fake.Ack(100), 2, /*expect_ready=*/false);
  Result<std::unique_ptr<EngineSession>> connected = session.get();
  ASSERT_FALSE(connected.ok());
  EXPECT_NE(connected.status().message().find("wrong launch token"), std::string::npos)
      << connected.status().ToString();
}

TEST(EngineSdk, RegisterAckWithoutThePoolFdIsRefused) {
  FakeController fake;
  auto session =
      std::async(std::launch::async, [&] { return EngineSession::Connect(fake.Options()); });
  fake.ServeRegistration(fake.Ack(100), 1, /*expect_ready=*/false);
  Result<std::unique_ptr<EngineSession>> connected = session.get();
  ASSERT_FALSE(connected.ok());
  EXPECT_EQ(connected.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(connected.status().message().find("expected 2"), std::string::npos);
}

// A partial weight arena: its huge-page part and its 4 KiB part come as two fds (protocol 8),
// and the engine maps them back to back, so a tensor across the split reads whole.
struct PartialArena {
  SharedMemory first =
      Take(SharedMemory::Create({.name = "partial-2m",
                                 .size = kHugePageSize,
                                 .try_huge_pages = arena_testing::HugePagesFree() > 0}));
  SharedMemory second =
      Take(SharedMemory::Create({.name = "partial-4k", .size = 8192, .try_huge_pages = false}));
  static uint8_t ByteAt(size_t i) { return static_cast<uint8_t>(i * 13 + 1); }
  PartialArena() {
    Mapping rw = Take(MapBackToBack(first, second, Protection::kReadWrite));
    for (size_t i = 0; i < rw.size(); ++i) rw.data()[i] = ByteAt(i);
  }
  proto::RegisterAck Ack(const FakeController& fake) const {
    proto::RegisterAck ack = fake.Ack(100);
    ack.arena_size = first.size() + second.size();
    ack.arena_huge_pages = first.huge_pages();
    ack.tensors = {{"across", 9 /*U8*/, {8192}, kHugePageSize - 4096, 8192},
                   {"last", 9, {16}, ack.arena_size - 16, 16}};
    return ack;
  }
};

TEST(EngineSdk, MapsAPartialArenaBackToBackAndReadsAcrossTheSplit) {
  FakeController fake;
  PartialArena parts;
  auto session = std::async(std::launch::async,
                            [&] { return EngineSession::Connect(fake.ReattachingOptions()); });
  fake.ServePartialRegistration(parts.Ack(fake), parts.first, parts.second);
  Result<std::unique_ptr<EngineSession>> connected = session.get();
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  const MappedWeights& w = (*connected)->weights();
  EXPECT_EQ(w.size, kHugePageSize + 8192);
  const MappedTensor* across = w.Find("across");
  ASSERT_NE(across, nullptr);
  for (size_t i = 0; i < across->size; ++i) {
    ASSERT_EQ(across->data[i], PartialArena::ByteAt(kHugePageSize - 4096 + i)) << "byte " << i;
  }
  const MappedTensor* last = w.Find("last");
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->data[15], PartialArena::ByteAt(w.size - 1));
  EXPECT_FALSE(AnyWritable(MappingsIn(w.base, w.size)));
}

TEST(EngineSdk, AnEngineOfAnOlderProtocolRefusesThreeFds) {
  FakeController fake;
  PartialArena parts;
  auto session =
      std::async(std::launch::async, [&] { return EngineSession::Connect(fake.Options()); });
  fake.ServePartialRegistration(parts.Ack(fake), parts.first, parts.second,
                                /*expect_ready=*/false);
  Result<std::unique_ptr<EngineSession>> connected = session.get();
  ASSERT_FALSE(connected.ok());
  EXPECT_NE(connected.status().message().find("carries 3 fds; expected 2"), std::string::npos)
      << connected.status().ToString();
}

TEST(EngineSdk, TensorOutsideTheArenaIsRefused) {
  FakeController fake;
  proto::RegisterAck ack = fake.Ack(100);
  ack.tensors.push_back({"c", 2, {4}, 8190, 16});
  auto session =
      std::async(std::launch::async, [&] { return EngineSession::Connect(fake.Options()); });
  fake.ServeRegistration(ack, 2, /*expect_ready=*/false);
  Result<std::unique_ptr<EngineSession>> connected = session.get();
  ASSERT_FALSE(connected.ok());
  EXPECT_NE(connected.status().message().find("tensor c lies outside the arena"), std::string::npos)
      << connected.status().ToString();
}

TEST(EngineSdk, LaunchInfoFromEnvNamesWhatIsMissing) {
  ::unsetenv("BATON_SOCKET");
  Result<EngineLaunchInfo> missing = LaunchInfoFromEnv();
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("BATON_SOCKET"), std::string::npos);
  ::setenv("BATON_SOCKET", "/tmp/x.sock", 1);
  ::setenv("BATON_LAUNCH_TOKEN", "t", 1);
  ::setenv("BATON_ENGINE_ID", "12x", 1);
  EXPECT_FALSE(LaunchInfoFromEnv().ok());
  ::setenv("BATON_ENGINE_ID", "12", 1);
  ::setenv("BATON_ROLE", "standby", 1);
  ::setenv("BATON_HTTP_PORT", "8101", 1);
  Result<EngineLaunchInfo> info = LaunchInfoFromEnv();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->engine_id, 12u);
  EXPECT_EQ(info->http_port, 8101);
  EXPECT_EQ(info->role, "standby");
  for (const char* v :
       {"BATON_SOCKET", "BATON_LAUNCH_TOKEN", "BATON_ENGINE_ID", "BATON_ROLE", "BATON_HTTP_PORT"}) {
    ::unsetenv(v);
  }
}

}  // namespace
}  // namespace baton::testing
