// The engine SDK's side of a promotion before the old primary's barrier (protocol 7): the
// Quarantined blocks' headers read unmapped, the blocks mapped read-only only when the engine
// asks (for a copy), never writable, until their Grant
// maps them writable with the headers the dead engine left; the wait for that Grant; the
// report of how the engine took their KV.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "standby/sdk/engine_sdk.h"
#include "tests/standby/fake_controller.h"
#include "tests/standby/sdk/mappings_testutil.h"

namespace baton::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

bool AllReadOnly(const std::vector<std::string>& perms) {
  if (perms.empty()) return false;
  for (const std::string& p : perms) {
    if (p[0] != 'r' || p[1] == 'w') return false;
  }
  return true;
}

TEST(EngineQuarantine, QuarantinedBlocksAreReadOnlyUntilTheirGrant) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50, fake.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  std::memset(fake.block(1), 0xAB, kFakeBlockBytes);  // the dying primary's blocks
  std::memset(fake.block(2), 0xCD, kFakeBlockBytes);
  ASSERT_TRUE(
      fake.channel()
          .Send(proto::Quarantined{
              .epoch = 7, .extents = {{1, 2}}, .barrier_estimate_us = 1500, .wait_limit_ms = 200})
          .ok());
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 7, .extents = {{5, 2}}}).ok());
  Result<SessionEvent> promoted = s->WaitForPromotion(seconds(30));
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  ASSERT_EQ(promoted->quarantined.size(), 1u);
  const MappedExtent& q = promoted->quarantined[0];
  EXPECT_EQ(q.first, 1u);
  EXPECT_EQ(q.count, 2u);
  EXPECT_EQ(q.data, nullptr) << "the promotion maps nothing of them";
  for (const std::string& p : MappingsIn(s->pool().BlockData(1), 2 * kFakeBlockBytes)) {
    EXPECT_EQ(p.substr(0, 3), "---") << "not mapped, no page of theirs faulted in";
  }
  EXPECT_EQ(promoted->barrier_estimate, std::chrono::microseconds(1500));
  EXPECT_EQ(promoted->wait_limit, milliseconds(200));
  // Their headers as the dead engine left them, nothing scrubbed: they are not this engine's.
  ASSERT_EQ(promoted->quarantined_headers.size(), 2 * kBlockHeaderBytes);
  EXPECT_EQ(promoted->quarantined_headers[0], 0xAB);
  EXPECT_EQ(promoted->quarantined_headers[kBlockHeaderBytes], 0xCD);
  EXPECT_EQ(fake.block(1)[0], 0xAB);
  // An engine that copies maps them: read-only, never writable.
  Result<std::vector<MappedExtent>> view = s->MapQuarantined();
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  ASSERT_EQ(view->size(), 1u);
  const uint8_t* data = (*view)[0].data;
  EXPECT_EQ(data, s->pool().BlockData(1));
  EXPECT_TRUE(AllReadOnly(MappingsIn(s->pool().BlockData(1), 2 * kFakeBlockBytes)))
      << "a quarantined block is mapped read-only, never writable";
  EXPECT_EQ(data[kBlockHeaderBytes + 1], 0xAB) << "and readable";
  fake.block(1)[200] = 0x11;  // a stale write of the dying engine lands: the view sees it
  EXPECT_EQ(data[200], 0x11);
  Result<std::vector<MappedExtent>> again = s->MapQuarantined();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].data, data) << "mapped once";
  EXPECT_TRUE(AllWritable(MappingsIn(s->pool().BlockData(5), 2 * kFakeBlockBytes)));

  // Once past the barrier: the Grant maps them writable and hands over their headers.
  ASSERT_TRUE(fake.channel().Send(proto::Grant{.epoch = 7, .extents = {{1, 2}}}).ok());
  Result<SessionEvent> inherited = s->WaitForInheritedBlocks(seconds(30));
  ASSERT_TRUE(inherited.ok()) << inherited.status().ToString();
  EXPECT_EQ(inherited->kind, SessionEventKind::kGranted);
  ASSERT_EQ(inherited->inherited_headers.size(), 2 * kBlockHeaderBytes);
  EXPECT_EQ(inherited->inherited_headers[0], 0xAB);
  EXPECT_EQ(fake.block(1)[0], 0) << "scrubbed once this engine's";
  EXPECT_TRUE(AllWritable(MappingsIn(s->pool().BlockData(1), 2 * kFakeBlockBytes)));
  s->ReleaseQuarantined();  // nothing left read-only: the granted blocks stay mapped
  EXPECT_TRUE(AllWritable(MappingsIn(s->pool().BlockData(1), 2 * kFakeBlockBytes)));

  ASSERT_TRUE(s->ReportKvInheritance({.mode = KvInheritMode::kWaited,
                                      .blocks = 2,
                                      .bytes = 2 * kFakeBlockBytes,
                                      .ms = 1.5,
                                      .estimate_ms = 3})
                  .ok());
  const proto::KvInherited report = fake.Expect<proto::KvInherited>();
  EXPECT_EQ(report.epoch, 7u);
  EXPECT_EQ(report.mode, static_cast<uint8_t>(proto::KvInheritMode::kWaited));
  EXPECT_EQ(report.blocks, 2u);
  EXPECT_EQ(report.micros, 1500u);
  EXPECT_EQ(report.estimate_us, 3000u);
}

TEST(EngineQuarantine, ReleasedBeforeTheGrantTheBlocksAreUnmapped) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50, fake.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Quarantined{.epoch = 3, .extents = {{0, 2}}}).ok());
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 3, .extents = {{6, 1}}}).ok());
  Result<SessionEvent> promoted = s->WaitForPromotion(seconds(30));
  ASSERT_TRUE(promoted.ok());
  ASSERT_EQ(promoted->quarantined.size(), 1u);
  ASSERT_TRUE(s->MapQuarantined().ok());
  s->ReleaseQuarantined();  // the engine copied what it wanted
  const std::vector<std::string> perms = MappingsIn(s->pool().BlockData(0), 2 * kFakeBlockBytes);
  ASSERT_FALSE(perms.empty());
  for (const std::string& p : perms) EXPECT_EQ(p.substr(0, 3), "---") << "back to PROT_NONE";
  // A wait for them that ends before their Grant says so.
  Result<SessionEvent> none = s->WaitForInheritedBlocks(milliseconds(50));
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded);
  // A plain grant later carries no inherited headers.
  ASSERT_TRUE(fake.channel().Send(proto::Grant{.epoch = 3, .extents = {{0, 2}}}).ok());
  std::optional<SessionEvent> granted = s->NextEvent(seconds(30));
  ASSERT_TRUE(granted.has_value());
  EXPECT_TRUE(granted->inherited_headers.empty());
}

// The barrier passes before the engine has read the quarantined blocks: their Grant, held
// while the engine is promoted, maps them writable once the hold runs out. A read-only view is
// refused then; the Grant's event still hands over the headers the dead engine left, for the
// engine to adopt the blocks in place.
TEST(EngineQuarantine, AGrantBeforeTheReadLeavesTheHeadersToTheWait) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50, fake.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  std::memset(fake.block(1), 0xAB, kFakeBlockBytes);
  ASSERT_TRUE(fake.channel().Send(proto::Quarantined{.epoch = 7, .extents = {{1, 2}}}).ok());
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 7, .extents = {{5, 2}}}).ok());
  ASSERT_TRUE(fake.channel().Send(proto::Grant{.epoch = 7, .extents = {{1, 2}}}).ok());
  Result<SessionEvent> promoted = s->WaitForPromotion(seconds(30));
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  ASSERT_EQ(promoted->quarantined.size(), 1u);
  // The Grant is mapped once its hold runs out (the engine neither serves nor waits).
  for (const auto until = std::chrono::steady_clock::now() + seconds(30);
       !AllWritable(MappingsIn(s->pool().BlockData(1), kFakeBlockBytes)) &&
       std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(AllWritable(MappingsIn(s->pool().BlockData(1), kFakeBlockBytes)));
  const std::vector<uint32_t> blocks = {1};
  const Status view = s->MapQuarantined(blocks);
  EXPECT_EQ(view.code(), StatusCode::kFailedPrecondition) << view.ToString();
  Result<SessionEvent> inherited = s->WaitForInheritedBlocks(seconds(30));
  ASSERT_TRUE(inherited.ok()) << inherited.status().ToString();
  ASSERT_EQ(inherited->inherited_headers.size(), 2 * kBlockHeaderBytes);
  EXPECT_EQ(inherited->inherited_headers[0], 0xAB) << "the dead engine's header";
}

TEST(EngineQuarantine, AQuarantineForAnotherEpochIsIgnored) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50, fake.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Quarantined{.epoch = 4, .extents = {{0, 2}}}).ok());
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 5, .extents = {{6, 1}}}).ok());
  Result<SessionEvent> promoted = s->WaitForPromotion(seconds(30));
  ASSERT_TRUE(promoted.ok());
  EXPECT_TRUE(promoted->quarantined.empty());
  EXPECT_FALSE(AnyWritable(MappingsIn(s->pool().BlockData(0), 2 * kFakeBlockBytes)));
  for (const std::string& p : MappingsIn(s->pool().BlockData(0), 2 * kFakeBlockBytes)) {
    EXPECT_EQ(p.substr(0, 3), "---");
  }
}

// A restarted controller that cannot account for the quarantined blocks says so with an empty
// Quarantined at the promotion's epoch: a wait for their Grant ends at once (NotFound), and one
// for another epoch changes nothing.
TEST(EngineQuarantine, AnEmptyQuarantineAfterThePromoteEndsTheWait) {
  FakeController fake;
  std::unique_ptr<EngineSession> s = ConnectSession(fake, 50, fake.ReattachingOptions());
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(fake.channel().Send(proto::Quarantined{.epoch = 3, .extents = {{0, 2}}}).ok());
  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 3, .extents = {{6, 1}}}).ok());
  Result<SessionEvent> promoted = s->WaitForPromotion(seconds(30));
  ASSERT_TRUE(promoted.ok());
  ASSERT_EQ(promoted->quarantined.size(), 1u);
  ASSERT_TRUE(fake.channel().Send(proto::Quarantined{.epoch = 2, .extents = {}}).ok());
  Result<SessionEvent> waited = s->WaitForInheritedBlocks(milliseconds(100));
  EXPECT_EQ(waited.status().code(), StatusCode::kDeadlineExceeded) << waited.status().ToString();
  ASSERT_TRUE(fake.channel().Send(proto::Quarantined{.epoch = 3, .extents = {}}).ok());
  const auto start = std::chrono::steady_clock::now();
  Result<SessionEvent> none = s->WaitForInheritedBlocks(seconds(30));
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(10));
  const std::vector<uint32_t> blocks = {0};
  EXPECT_EQ(s->MapQuarantined(blocks).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace baton::testing
