// Refusals are counted and kept for status one by one, but logged at most ten a second: a
// flood of bad connections writes a few lines, the next of which says how many it left out.
#include "tests/controller/core/scenario.h"

namespace baton::sim {
namespace {

class RefusalLog : public Scenario {};

TEST_F(RefusalLog, AFloodOfRefusalsIsLoggedTenASecond) {
  StartReadyPair();
  const uint64_t before = coord().Snapshot().refusal_count;
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 25; ++i) coord().NoteRefusal("peer", "no Hello within 5 s");
  Wait(std::chrono::seconds(1));
  coord().NoteRefusal("peer", "no Hello within 5 s");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Occurrences(log, "WARN controller: refused peer: no Hello within 5 s"), 11u) << log;
  EXPECT_EQ(Occurrences(log, "(15 refusals before it not logged: more than 10 a second)"), 1u)
      << log;
  EXPECT_EQ(coord().Snapshot().refusal_count, before + 26) << "every one is counted";
}

}  // namespace
}  // namespace baton::sim
