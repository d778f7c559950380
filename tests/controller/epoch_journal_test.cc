#include "controller/epoch_journal.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace baton {
namespace {

class EpochJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/baton-journal-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/epoch";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void WriteFile(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string dir_;
  std::string path_;
};

TEST_F(EpochJournalTest, CreatesAtZeroAndAdvancesDurably) {
  Result<EpochJournal> journal = EpochJournal::Open(path_);
  ASSERT_TRUE(journal.ok()) << journal.status().ToString();
  EXPECT_EQ(journal->current(), 0u);
  EXPECT_EQ(ReadFile(path_).size(), EpochJournal::kRecordSize);
  for (uint64_t want = 1; want <= 5; ++want) {
    Result<uint64_t> next = journal->Advance();
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(*next, want);
    EXPECT_EQ(journal->current(), want);
    // Durable before it is returned: the committed reservation already covers it.
    EXPECT_GE(*EpochJournal::DecodeRecord(ReadFile(path_), path_), want);
  }
  EXPECT_EQ(*EpochJournal::DecodeRecord(ReadFile(path_), path_), EpochJournal::kDefaultReserveBatch)
      << "one write for the whole batch";
}

TEST_F(EpochJournalTest, ABatchIsOneWriteAndReplenishKeepsItAhead) {
  auto journal = EpochJournal::Open(path_);
  ASSERT_TRUE(journal.ok());
  ASSERT_TRUE(journal->Replenish().ok());
  EXPECT_EQ(journal->reserved(), EpochJournal::kDefaultReserveBatch);
  // With every write failing (the temporary path is a directory), the reservation still
  // hands out its epochs: they need no write.
  ASSERT_EQ(::mkdir((path_ + ".tmp").c_str(), 0700), 0);
  for (uint64_t want = 1; want <= EpochJournal::kDefaultReserveBatch; ++want) {
    Result<uint64_t> next = journal->Advance();
    ASSERT_TRUE(next.ok()) << "epoch " << want << ": " << next.status().ToString();
    ASSERT_EQ(*next, want);
  }
  EXPECT_FALSE(journal->Advance().ok()) << "past the reservation it must write";
  ASSERT_EQ(::rmdir((path_ + ".tmp").c_str()), 0);
  ASSERT_EQ(*journal->Advance(), EpochJournal::kDefaultReserveBatch + 1);
  const uint64_t reserved = journal->reserved();
  EXPECT_GE(reserved - journal->current(), EpochJournal::kDefaultReserveBatch / 2);
  ASSERT_TRUE(journal->Replenish().ok());
  EXPECT_EQ(journal->reserved(), reserved) << "half a batch or more was left: no write";
  while (journal->reserved() - journal->current() >= EpochJournal::kDefaultReserveBatch / 2) {
    ASSERT_TRUE(journal->Advance().ok());
  }
  ASSERT_TRUE(journal->Replenish().ok());
  EXPECT_GT(journal->reserved(), reserved) << "less than half a batch left: one more batch";
  EXPECT_EQ(*EpochJournal::DecodeRecord(ReadFile(path_), path_), journal->reserved());
}

TEST_F(EpochJournalTest, ReopenSeesLastEpochAndNeverRepeats) {
  {
    auto journal = EpochJournal::Open(path_);
    ASSERT_TRUE(journal.ok());
    for (int i = 0; i < 7; ++i) ASSERT_TRUE(journal->Advance().ok());
  }
  auto journal = EpochJournal::Open(path_);
  ASSERT_TRUE(journal.ok()) << journal.status().ToString();
  // A restart starts after the whole reservation: 8..64 may be skipped, none repeats.
  EXPECT_EQ(journal->current(), EpochJournal::kDefaultReserveBatch);
  auto next = journal->Advance();
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, EpochJournal::kDefaultReserveBatch + 1);
}

TEST_F(EpochJournalTest, SecondOpenWhileHeldIsRefused) {
  auto first = EpochJournal::Open(path_);
  ASSERT_TRUE(first.ok());
  auto second = EpochJournal::Open(path_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);
}

TEST_F(EpochJournalTest, CorruptRecordIsRefusedNotReset) {
  {
    auto journal = EpochJournal::Open(path_);
    ASSERT_TRUE(journal.ok());
    ASSERT_TRUE(journal->Advance().ok());
  }
  std::string bytes = ReadFile(path_);
  bytes[9] ^= 0x40;  // flip a bit of the epoch
  WriteFile(path_, bytes);
  auto journal = EpochJournal::Open(path_);
  ASSERT_FALSE(journal.ok());
  EXPECT_EQ(journal.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(journal.status().message().find("CRC"), std::string::npos);
  EXPECT_NE(journal.status().message().find(path_), std::string::npos);
  // The bad record is left in place for the operator.
  EXPECT_EQ(ReadFile(path_), bytes);
}

TEST_F(EpochJournalTest, ShortAndForeignRecordsAreRefused) {
  WriteFile(path_, std::string(10, 'x'));
  auto short_record = EpochJournal::Open(path_);
  ASSERT_FALSE(short_record.ok());
  EXPECT_NE(short_record.status().message().find("10 bytes, expected 24"), std::string::npos);

  WriteFile(path_, std::string(EpochJournal::kRecordSize, 'x'));
  auto foreign = EpochJournal::Open(path_);
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().message().find("bad magic"), std::string::npos);

  WriteFile(path_, "");
  auto empty = EpochJournal::Open(path_);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kDataLoss);
}

TEST_F(EpochJournalTest, TornTemporaryFileDoesNotAffectCommittedEpoch) {
  {
    auto journal = EpochJournal::Open(path_);
    ASSERT_TRUE(journal.ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(journal->Advance().ok());
  }
  // A crash mid-commit leaves a truncated or garbage temporary record behind.
  WriteFile(path_ + ".tmp", EpochJournal::EncodeRecord(4).substr(0, 11));
  {
    auto journal = EpochJournal::Open(path_);
    ASSERT_TRUE(journal.ok()) << journal.status().ToString();
    EXPECT_EQ(journal->current(), EpochJournal::kDefaultReserveBatch);
    EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
  }
  WriteFile(path_ + ".tmp", std::string(EpochJournal::kRecordSize, '\xff'));
  auto journal = EpochJournal::Open(path_);
  ASSERT_TRUE(journal.ok());
  EXPECT_EQ(journal->current(), EpochJournal::kDefaultReserveBatch);
  EXPECT_EQ(*journal->Advance(), EpochJournal::kDefaultReserveBatch + 1);
}

TEST_F(EpochJournalTest, FailedCommitNeverReusesTheAttemptedEpoch) {
  auto journal = EpochJournal::Open(path_);
  ASSERT_TRUE(journal.ok());
  for (uint64_t i = 1; i <= EpochJournal::kDefaultReserveBatch; ++i)
    ASSERT_EQ(*journal->Advance(), i);
  // Make the temporary path unusable: a directory cannot be opened for writing.
  ASSERT_EQ(::mkdir((path_ + ".tmp").c_str(), 0700), 0);
  auto failed = journal->Advance();
  ASSERT_FALSE(failed.ok()) << "the next epoch needs a new reservation, which cannot be written";
  EXPECT_EQ(journal->current(), EpochJournal::kDefaultReserveBatch);
  EXPECT_FALSE(journal->Replenish().ok());
  ASSERT_EQ(::rmdir((path_ + ".tmp").c_str()), 0);
  auto next = journal->Advance();
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, EpochJournal::kDefaultReserveBatch + 1);
  // The failed reservations may be on disk somewhere; the next one lies past all of them.
  EXPECT_GT(journal->reserved(), 3 * EpochJournal::kDefaultReserveBatch);
}

TEST_F(EpochJournalTest, ABatchOfOneWritesEveryEpochAndCountsFailedWrites) {
  auto journal = EpochJournal::Open(path_, 1);
  ASSERT_TRUE(journal.ok()) << journal.status().ToString();
  EXPECT_EQ(journal->reserve_batch(), 1u);
  EXPECT_TRUE(journal->last_write().ok());
  ASSERT_TRUE(journal->Replenish().ok());
  EXPECT_EQ(journal->reserved(), 0u) << "a batch of 1 keeps nothing ahead";
  for (uint64_t want = 1; want <= 3; ++want) {
    ASSERT_EQ(*journal->Advance(), want);
    EXPECT_EQ(*EpochJournal::DecodeRecord(ReadFile(path_), path_), want) << "one write each";
  }
  ASSERT_EQ(::mkdir((path_ + ".tmp").c_str(), 0700), 0);
  EXPECT_FALSE(journal->Advance().ok()) << "with no reservation ahead, a failed write fails it";
  EXPECT_FALSE(journal->last_write().ok());
  EXPECT_NE(journal->last_write().message().find(".tmp"), std::string::npos)
      << journal->last_write().ToString();
  EXPECT_FALSE(journal->Advance().ok());
  EXPECT_EQ(journal->write_failures(), 2u);
  ASSERT_EQ(::rmdir((path_ + ".tmp").c_str()), 0);
  const Result<uint64_t> next = journal->Advance();
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(*next, 4u) << "no epoch was handed out by the failed tries";
  EXPECT_EQ(journal->reserved(), 6u) << "past both attempted reservations, 4 and 5";
  EXPECT_TRUE(journal->last_write().ok()) << "a good write clears the error";
  EXPECT_EQ(journal->write_failures(), 2u);
}

// After a failed write Replenish tries again, even with a batch of 1 (which otherwise reserves
// nothing ahead), so that the error clears once the journal can be written again.
TEST_F(EpochJournalTest, ReplenishClearsTheErrorOfAFailedWrite) {
  for (uint64_t batch : {uint64_t{1}, uint64_t{64}}) {
    std::filesystem::remove(path_);
    auto journal = EpochJournal::Open(path_, batch);
    ASSERT_TRUE(journal.ok()) << journal.status().ToString();
    ASSERT_EQ(::mkdir((path_ + ".tmp").c_str(), 0700), 0);
    while (journal->Advance().ok()) {
    }
    ASSERT_FALSE(journal->last_write().ok());
    EXPECT_NE(journal->last_write().message().find("reserving epochs through"), std::string::npos)
        << journal->last_write().ToString();
    EXPECT_FALSE(journal->Replenish().ok()) << "batch " << batch;
    ASSERT_EQ(::rmdir((path_ + ".tmp").c_str()), 0);
    ASSERT_TRUE(journal->Replenish().ok()) << "batch " << batch;
    EXPECT_TRUE(journal->last_write().ok()) << "batch " << batch;
    EXPECT_GT(journal->reserved(), journal->current()) << "batch " << batch;
  }
}

TEST_F(EpochJournalTest, ABatchOfZeroIsRefused) {
  const auto journal = EpochJournal::Open(path_, 0);
  ASSERT_FALSE(journal.ok());
  EXPECT_EQ(journal.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EpochJournalTest, MissingDirectoryIsNamed) {
  auto journal = EpochJournal::Open(dir_ + "/nope/epoch");
  ASSERT_FALSE(journal.ok());
  EXPECT_NE(journal.status().message().find(dir_ + "/nope"), std::string::npos);
}

TEST(EpochRecordTest, RoundTripsAndChecksPadding) {
  const std::string record = EpochJournal::EncodeRecord(0x0123456789abcdefull);
  ASSERT_EQ(record.size(), EpochJournal::kRecordSize);
  auto epoch = EpochJournal::DecodeRecord(record, "mem");
  ASSERT_TRUE(epoch.ok());
  EXPECT_EQ(*epoch, 0x0123456789abcdefull);
  std::string padded = record;
  padded[22] = 1;
  EXPECT_FALSE(EpochJournal::DecodeRecord(padded, "mem").ok());
}

}  // namespace
}  // namespace baton
