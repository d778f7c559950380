// RosterFile: the roster in two slots written in place; the newest whole slot is read back,
// a slot cut short falls back to the other, an older controller's single roster.json loads.
#include "controller/roster_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "tests/proto/proto_test_util.h"

namespace baton {
namespace {

using TempDir = ::baton::proto::testing::TempDir;

Roster WithEngines(int n, uint64_t incarnation) {
  Roster r;
  r.boot_id = "b00t";
  r.incarnation = incarnation;
  r.next_engine_id = static_cast<EngineId>(n + 1);
  for (int i = 1; i <= n; ++i) {
    RosterEngine e;
    e.id = static_cast<EngineId>(i);
    e.pid = 1000 + i;
    e.role = RosterRole::kStandby;
    e.command = {"engine", "--a-long-flag-to-make-the-roster-longer", std::to_string(i)};
    r.engines.push_back(e);
  }
  return r;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

uint64_t SizeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

TEST(RosterFile, NoneIsNoRoster) {
  TempDir dir;
  RosterFile file(dir.File(""));
  Result<std::optional<Roster>> r = file.Load();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->has_value());
}

TEST(RosterFile, TheNewestSlotIsReadAndTheSlotsAlternate) {
  TempDir dir;
  RosterFile file(dir.File(""));
  for (uint64_t i = 1; i <= 5; ++i) ASSERT_TRUE(file.Save(WithEngines(2, i)).ok());
  EXPECT_GT(SizeOf(file.SlotPath(0)), 0u);
  EXPECT_GT(SizeOf(file.SlotPath(1)), 0u);
  RosterFile next(dir.File(""));
  Result<std::optional<Roster>> r = next.Load();
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ((*r)->incarnation, 5u);
  EXPECT_EQ((*r)->sequence, 5u);
  // A later controller numbers on: its first save is the newest.
  ASSERT_TRUE(next.Save(WithEngines(1, 6)).ok());
  Result<std::optional<Roster>> again = RosterFile(dir.File("")).Load();
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->incarnation, 6u);
  EXPECT_EQ((*again)->engines.size(), 1u);
}

TEST(RosterFile, AShorterRosterIsPaddedNotTruncated) {
  TempDir dir;
  RosterFile file(dir.File(""));
  ASSERT_TRUE(file.Save(WithEngines(6, 1)).ok());
  ASSERT_TRUE(file.Save(WithEngines(6, 2)).ok());
  const uint64_t long_size = SizeOf(file.SlotPath(1));
  ASSERT_TRUE(file.Save(WithEngines(1, 3)).ok());  // slot 1 again, much shorter
  EXPECT_EQ(SizeOf(file.SlotPath(1)), long_size) << "written in place, never truncated";
  Result<std::optional<Roster>> r = RosterFile(dir.File("")).Load();
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ((*r)->incarnation, 3u);
  EXPECT_EQ((*r)->engines.size(), 1u);
}

TEST(RosterFile, ASlotCutShortFallsBackToTheOther) {
  TempDir dir;
  RosterFile file(dir.File(""));
  ASSERT_TRUE(file.Save(WithEngines(2, 1)).ok());  // slot 1
  ASSERT_TRUE(file.Save(WithEngines(2, 2)).ok());  // slot 0, the newest
  // A write cut short that still parses: an epoch changed in the part that was written.
  std::string text = Slurp(file.SlotPath(0));
  const size_t at = text.find("\"incarnation\": 2");
  ASSERT_NE(at, std::string::npos);
  text[at + std::string("\"incarnation\": ").size()] = '7';
  std::ofstream(file.SlotPath(0)) << text;
  Result<std::optional<Roster>> r = RosterFile(dir.File("")).Load();
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ((*r)->incarnation, 1u) << "the checksum refused the newer slot";
  // And one that does not parse at all.
  std::ofstream(file.SlotPath(0)) << "{\"format\": 1, \"engi";
  r = RosterFile(dir.File("")).Load();
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->incarnation, 1u);
}

TEST(RosterFile, NeitherSlotWholeIsRefusedNamingBoth) {
  TempDir dir;
  RosterFile file(dir.File(""));
  std::ofstream(file.SlotPath(0)) << "{\"format\": 1, \"engines\": [tr";
  std::ofstream(file.SlotPath(1)) << "not json";
  Result<std::optional<Roster>> r = file.Load();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("roster.json"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("roster.1.json"), std::string::npos);
}

TEST(RosterFile, AnOlderControllersSingleRosterLoads) {
  TempDir dir;
  RosterFile file(dir.File(""));
  std::ofstream(file.SlotPath(0)) << EncodeRoster(WithEngines(2, 4));  // no sequence, no checksum
  Result<std::optional<Roster>> r = file.Load();
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
  EXPECT_EQ((*r)->incarnation, 4u);
  ASSERT_TRUE(file.Save(WithEngines(1, 5)).ok());
  EXPECT_EQ(Slurp(file.SlotPath(0)), EncodeRoster(WithEngines(2, 4))) << "kept as the older";
  r = RosterFile(dir.File("")).Load();
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->incarnation, 5u);
}

}  // namespace
}  // namespace baton
