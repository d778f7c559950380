#include "controller/upgrade/command_record.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

namespace baton {
namespace {

class CommandRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/baton-command-record-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/engine_command.json";
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  void Write(const std::string& text) { std::ofstream(path_) << text; }

  std::string dir_;
  std::string path_;
};

TEST_F(CommandRecordTest, NoFileIsNoRecord) {
  Result<std::optional<CommandRecord>> r = LoadCommandRecord(path_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->has_value());
}

TEST_F(CommandRecordTest, SavedThenLoaded) {
  const CommandRecord want{{"eng", "--v", "1"}, {"eng", "--v", "2"}, {"eng", "--v", "1"}};
  ASSERT_TRUE(SaveCommandRecord(path_, want).ok());
  Result<std::optional<CommandRecord>> got = LoadCommandRecord(path_);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, want);
  EXPECT_NE(::access((path_ + ".tmp").c_str(), F_OK), 0) << "the temporary file is renamed";
}

// JSON holds UTF-8 only: a command of other bytes is refused, and the saved record stays.
TEST_F(CommandRecordTest, ACommandThatIsNotUtf8IsRefusedAndTheRecordKept) {
  const CommandRecord kept{{"eng"}, {"eng"}, {}};
  ASSERT_TRUE(SaveCommandRecord(path_, kept).ok());
  CommandRecord bad = kept;
  bad.in_flight = InFlightUpgrade{.kind = UpgradeKind::kUpgrade,
                                  .command = {"eng", "caf\xE9"},
                                  .phase = UpgradePhase::kCanary,
                                  .canary = 2,
                                  .weight = 0};
  Status s = SaveCommandRecord(path_, bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("word 2"), std::string::npos) << s.ToString();
  bad = kept;
  bad.active = {"\xC0\xAF"};
  EXPECT_FALSE(SaveCommandRecord(path_, bad).ok());
  Result<std::optional<CommandRecord>> got = LoadCommandRecord(path_);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ(**got, kept);
  EXPECT_TRUE(CheckRecordableCommand({"caf\xC3\xA9"}, "x").ok());
}

// The phase is kept by name, the text the operator reads in the state directory.
TEST_F(CommandRecordTest, EveryPhaseIsSavedByNameAndLoadedBack) {
  for (UpgradePhase phase : kUpgradePhases) {
    CommandRecord want{{"eng"}, {"eng"}, {}};
    want.in_flight = InFlightUpgrade{
        .kind = UpgradeKind::kRollback, .command = {"eng"}, .phase = phase, .canary = 3};
    ASSERT_TRUE(SaveCommandRecord(path_, want).ok());
    std::ifstream in(path_);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(std::string("\"phase\": \"") + ToString(phase) + "\""), std::string::npos)
        << text;
    Result<std::optional<CommandRecord>> got = LoadCommandRecord(path_);
    ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
    EXPECT_EQ((*got)->ignored, "");
    EXPECT_EQ(**got, want) << ToString(phase);
  }
}

TEST_F(CommandRecordTest, AnUpgradeInFlightIsSavedThenLoaded) {
  CommandRecord want{{"eng", "--v", "1"}, {"eng", "--v", "1"}, {}};
  want.in_flight = InFlightUpgrade{.kind = UpgradeKind::kUpgrade,
                                   .command = {"eng", "--v", "2"},
                                   .phase = UpgradePhase::kCanary,
                                   .canary = 7,
                                   .weight = 50};
  ASSERT_TRUE(SaveCommandRecord(path_, want).ok());
  Result<std::optional<CommandRecord>> got = LoadCommandRecord(path_);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, want);
}

// A broken upgrade-in-flight entry does not cost the promoted command: it is ignored, and
// the record says why.
TEST_F(CommandRecordTest, ABrokenInFlightEntryIsIgnoredWithTheReason) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"configured": ["a"], "active": ["b"], "previous": ["a"], "in_flight": 3})",
       "'in_flight' needs kind, phase, canary and weight"},
      {R"({"configured": ["a"], "active": ["b"], "previous": ["a"], "in_flight": {"kind":
          "upgrade", "phase": "canary", "canary": 2, "weight": 10, "command": "x"}})",
       "'command' is not an array"},
      {R"({"configured": ["a"], "active": ["b"], "previous": ["a"], "in_flight": {"kind":
          "upgrade", "phase": "warming", "canary": 2, "weight": 10, "command": ["x"]}})",
       "'in_flight': unknown upgrade phase 'warming' (launching, reclaiming, promoting, canary, "
       "finishing or rolling_back)"},
  };
  for (const auto& [text, want] : cases) {
    Write(text);
    Result<std::optional<CommandRecord>> r = LoadCommandRecord(path_);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value());
    EXPECT_EQ((*r)->active, std::vector<std::string>{"b"});
    EXPECT_EQ((*r)->previous, std::vector<std::string>{"a"});
    EXPECT_FALSE((*r)->in_flight.has_value());
    EXPECT_NE((*r)->ignored.find(want), std::string::npos) << (*r)->ignored;
  }
}

TEST_F(CommandRecordTest, BrokenFilesAreRefusedWithTheReason) {
  const std::pair<const char*, const char*> cases[] = {
      {"not json", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {R"({"configured": ["a"], "active": "b", "previous": []})", "'active' is not an array"},
      {R"({"configured": ["a"], "active": [1], "previous": []})", "'active' holds a non-string"},
      {R"({"configured": ["a"], "active": [], "previous": []})", "'active' is empty"},
      {R"({"configured": ["a"], "active": ["b"]})", "'previous' is not an array"},
  };
  for (const auto& [text, want] : cases) {
    Write(text);
    Result<std::optional<CommandRecord>> r = LoadCommandRecord(path_);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find(path_), std::string::npos) << "names the file";
  }
}

}  // namespace
}  // namespace baton
