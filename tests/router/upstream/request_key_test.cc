// NewRequestKey: 128 random bits as 32 lowercase hex digits, a different key every call, on
// every thread.
#include "router/upstream/request_key.h"

#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace baton {
namespace {

TEST(RequestKeyTest, ThirtyTwoLowercaseHexDigits) {
  for (int i = 0; i < 100; ++i) {
    const std::string key = NewRequestKey();
    EXPECT_EQ(key.size(), kRequestKeyHexDigits);
    EXPECT_TRUE(IsRequestKey(key)) << key;
  }
  EXPECT_FALSE(IsRequestKey(std::string(31, 'a')));
  EXPECT_FALSE(IsRequestKey(std::string(33, 'a')));
  EXPECT_FALSE(IsRequestKey(std::string(32, 'A')));
  EXPECT_FALSE(IsRequestKey(std::string(31, 'a') + "g"));
}

TEST(RequestKeyTest, EveryKeyDiffersAcrossThreads) {
  std::mutex mu;
  std::set<std::string> keys;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        const std::string key = NewRequestKey();
        std::lock_guard<std::mutex> lock(mu);
        keys.insert(key);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(keys.size(), 4000u);
}

}  // namespace
}  // namespace baton
