// What the PoolLedger tests share: an in-memory EpochStore, a block count, and a fixture of a
// 16-block pool with engine 1 the primary at epoch 1 and engine 2 a standby, its invariants
// checked after each test. A test class shapes the pool (a reserve, chunks) in Shape(), run
// before the engines are added.
//
// Header-only test support; one thread.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "controller/core/pool_ledger.h"

namespace baton::ledger_test {

class CounterEpochs final : public EpochStore {
 public:
  explicit CounterEpochs(uint64_t start = 0) : value_(start) {}
  uint64_t current() const override { return value_; }
  Result<uint64_t> Advance() override { return ++value_; }

 private:
  uint64_t value_ = 0;
};

inline uint32_t Blocks(const std::vector<Extent>& extents) {
  uint32_t n = 0;
  for (const Extent& x : extents) n += x.count;
  return n;
}

class LedgerFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Shape());
    ASSERT_TRUE(ledger_.AddStandby(1).ok());
    ASSERT_TRUE(ledger_.AddStandby(2).ok());
    ASSERT_TRUE(ledger_.Promote(1, *epochs_.Advance()).ok());
  }
  void TearDown() override {
    EXPECT_TRUE(ledger_.CheckInvariants().ok()) << ledger_.CheckInvariants().ToString();
  }
  virtual void Shape() {}

  CounterEpochs epochs_;
  PoolLedger ledger_{16, epochs_};
};

}  // namespace baton::ledger_test
