// The controller's device memory (cuda/device_owner.h) and an engine's view of it
// (cuda/device_session.h) over a real channel, on the emulated device: the weights' device
// copy equals the host arena and is mapped read-only, the pool is only reserved until blocks
// are granted, whole chunks are mapped for granted blocks and unmapped when the last one goes
// back, and a new holder finds the old holder's headers scrubbed but its data in place.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <vector>

#include "cuda/device_owner.h"
#include "cuda/device_session.h"
#include "proto/messages.h"
#include "tests/cuda_emulated/emulated_device.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kBlocks = 8;
constexpr uint64_t kBlockBytes = 1u << 20;  // two blocks per 2 MiB chunk
constexpr uint32_t kHeader = 64;

uint8_t* Ptr(uint64_t address) { return reinterpret_cast<uint8_t*>(address); }

class DeviceMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    arena_.resize(6u << 20);
    for (size_t i = 0; i < arena_.size(); ++i) arena_[i] = static_cast<uint8_t>(i * 13 + 5);
    Result<std::unique_ptr<DeviceOwner>> owner =
        DeviceOwner::Create({.device = 0,
                             .block_count = kBlocks,
                             .block_bytes = kBlockBytes,
                             .weights_chunk_bytes = 4u << 20,
                             .pool_chunk_bytes = 2u << 20},
                            std::span<uint8_t>(arena_));
    ASSERT_TRUE(owner.ok()) << owner.status().ToString();
    owner_ = std::move(owner).value();
  }

  // An engine's session: the owner shares, the session accepts and acks both regions.
  std::unique_ptr<DeviceSession> Borrow() {
    auto pair = proto::Channel::Pair(io_);
    EXPECT_TRUE(pair.ok());
    if (!pair.ok()) return nullptr;
    EXPECT_TRUE(owner_->Share(pair->first).ok());
    Result<std::unique_ptr<DeviceSession>> s =
        DeviceSession::Accept(pair->second, 0, kDeviceRegionCount, 5s);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    for (const char* name : {kDeviceWeightsRegion, kDevicePoolRegion}) {
      Result<proto::ReceivedMessage> msg = pair->first.Receive(5s);
      EXPECT_TRUE(msg.ok());
      if (!msg.ok()) return nullptr;
      Result<proto::ShareMemoryAck> ack = msg->As<proto::ShareMemoryAck>();
      EXPECT_TRUE(ack.ok() && ack->mapped && ack->name == name) << ack->name << ": " << ack->detail;
    }
    return s.ok() ? std::move(s).value() : nullptr;
  }

  boost::asio::io_context io_;
  std::vector<uint8_t> arena_;
  std::unique_ptr<DeviceOwner> owner_;
};

TEST_F(DeviceMemoryTest, OwnerCopiesTheWeightsAndSizesThePool) {
  const DeviceOwnerStats& s = owner_->stats();
  EXPECT_EQ(s.weights_bytes, 8u << 20);  // 6 MiB rounded up to 4 MiB chunks
  EXPECT_EQ(s.weights_chunks, 2u);
  EXPECT_EQ(s.pool_bytes, kBlocks * kBlockBytes);
  EXPECT_EQ(s.pool_chunk_bytes, 2u << 20);
  EXPECT_EQ(s.pool_chunks, 4u);
  EXPECT_NE(s.pinned.find("cuMemHostRegister"), std::string::npos) << s.pinned;
  EXPECT_NE(owner_->Describe().find("pool 8388608 bytes in 4 chunks"), std::string::npos)
      << owner_->Describe();
}

TEST_F(DeviceMemoryTest, EngineMapsTheWeightsReadOnlyAndOnlyReservesThePool) {
  std::unique_ptr<DeviceSession> s = Borrow();
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->weights().device, 0);
  ASSERT_GE(s->weights().bytes, arena_.size());
  EXPECT_EQ(std::memcmp(Ptr(s->weights().address), arena_.data(), arena_.size()), 0);
  EXPECT_EQ(s->pool().chunks, 4u);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(*reinterpret_cast<volatile uint8_t*>(s->weights().address) = 1, "")
      << "the weights are writable";
  EXPECT_DEATH((void)*reinterpret_cast<volatile uint8_t*>(s->pool().address), "")
      << "a standby's pool is readable before any grant";
}

TEST_F(DeviceMemoryTest, GrantedBlocksMapWholeChunksUntilTheLastGoesBack) {
  std::unique_ptr<DeviceSession> s = Borrow();
  ASSERT_NE(s, nullptr);
  uint8_t* pool = Ptr(s->pool().address);
  ASSERT_TRUE(s->MapBlocks(2, 3, kBlockBytes, kBlocks, kHeader, 5s).ok());  // chunks 1 and 2
  std::memset(pool + 2 * kBlockBytes, 0xAB, 3 * kBlockBytes);
  EXPECT_FALSE(s->MapBlocks(4, 1, kBlockBytes, kBlocks, kHeader, 5s).ok()) << "held twice";
  EXPECT_FALSE(s->MapBlocks(7, 2, kBlockBytes, kBlocks, kHeader, 5s).ok()) << "past the pool";
  ASSERT_TRUE(s->UnmapBlocks(2, 1).ok());
  pool[3 * kBlockBytes] = 1;  // chunk 1 stays mapped for block 3
  ASSERT_TRUE(s->UnmapBlocks(3, 2).ok());
  EXPECT_FALSE(s->UnmapBlocks(3, 1).ok()) << "returned twice";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(pool[3 * kBlockBytes] = 2, "") << "chunk 1 is still mapped";
}

TEST_F(DeviceMemoryTest, NextHolderFindsHeadersScrubbedAndDataInPlace) {
  std::unique_ptr<DeviceSession> primary = Borrow();
  ASSERT_NE(primary, nullptr);
  ASSERT_TRUE(primary->MapBlocks(0, kBlocks, kBlockBytes, kBlocks, kHeader, 5s).ok());
  std::memset(Ptr(primary->pool().address), 0x5A, kBlocks * kBlockBytes);
  primary.reset();  // the old holder is gone: its mappings with it

  std::unique_ptr<DeviceSession> standby = Borrow();
  ASSERT_NE(standby, nullptr);
  ASSERT_TRUE(standby->MapBlocks(0, kBlocks, kBlockBytes, kBlocks, kHeader, 5s).ok());
  const uint8_t* pool = Ptr(standby->pool().address);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    const uint8_t* block = pool + b * kBlockBytes;
    for (uint32_t i = 0; i < kHeader; ++i) ASSERT_EQ(block[i], 0) << "block " << b << " byte " << i;
    EXPECT_EQ(block[kHeader], 0x5A) << "block " << b << ": the device pool is shared memory";
    EXPECT_EQ(block[kBlockBytes - 1], 0x5A);
  }
}

// A promoted engine reads a dead predecessor's quarantined chunks for a copy of their KV:
// READ only (a write faults), never the chunks it holds, writable in place once granted (a
// reader keeps its view), and unmapped after the copy unless granted meanwhile.
TEST_F(DeviceMemoryTest, QuarantinedChunksAreReadOnlyUntilTheirGrant) {
  std::unique_ptr<DeviceSession> dead = Borrow();
  ASSERT_NE(dead, nullptr);
  ASSERT_TRUE(dead->MapBlocks(2, 6, kBlockBytes, kBlocks, kHeader, 5s).ok());  // chunks 1-3
  std::memset(Ptr(dead->pool().address) + 2 * kBlockBytes, 0x3C, 6 * kBlockBytes);

  std::unique_ptr<DeviceSession> s = Borrow();
  ASSERT_NE(s, nullptr);
  const uint8_t* pool = Ptr(s->pool().address);
  ASSERT_TRUE(s->MapBlocks(0, 2, kBlockBytes, kBlocks, kHeader, 5s).ok());  // the reserve
  ASSERT_TRUE(s->MapForReading(2, 6, kBlockBytes, kBlocks).ok());
  EXPECT_TRUE(s->MapForReading(2, 2, kBlockBytes, kBlocks).ok()) << "mapped already: nothing to do";
  EXPECT_EQ(pool[2 * kBlockBytes + kHeader], 0x3C) << "the dead engine's KV, read in place";
  EXPECT_EQ(pool[8 * kBlockBytes - 1], 0x3C);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(Ptr(s->pool().address)[4 * kBlockBytes] = 1, "")
      << "a quarantined chunk is writable";

  ASSERT_TRUE(s->MapBlocks(2, 2, kBlockBytes, kBlocks, kHeader, 5s).ok());  // chunk 1 granted
  Ptr(s->pool().address)[3 * kBlockBytes + kHeader] = 7;
  EXPECT_EQ(pool[2 * kBlockBytes], 0) << "its headers are scrubbed for the new holder";
  EXPECT_EQ(pool[2 * kBlockBytes + kHeader], 0x3C) << "its KV is in place";
  ASSERT_TRUE(s->UnmapRead().ok());
  EXPECT_EQ(pool[3 * kBlockBytes + kHeader], 7) << "the granted chunk stays mapped";
  EXPECT_DEATH((void)*reinterpret_cast<const volatile uint8_t*>(pool + 4 * kBlockBytes), "")
      << "a chunk still in quarantine is mapped after the copy";
  ASSERT_TRUE(s->UnmapRead().ok()) << "nothing left to unmap";
  ASSERT_TRUE(s->MapBlocks(4, 4, kBlockBytes, kBlocks, kHeader, 5s).ok()) << "mapped afresh";
}

TEST_F(DeviceMemoryTest, ADriverThatRefusesReadOnlyAccessMapsNoQuarantinedChunk) {
  std::unique_ptr<DeviceSession> s = Borrow();
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->MapBlocks(0, 2, kBlockBytes, kBlocks, kHeader, 5s).ok());
  ::setenv("BATON_FAKE_CUDA_NO_READ_ONLY", "1", 1);
  const Status read = s->MapForReading(2, 4, kBlockBytes, kBlocks);
  ::unsetenv("BATON_FAKE_CUDA_NO_READ_ONLY");
  EXPECT_EQ(read.code(), StatusCode::kFailedPrecondition) << read.ToString();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      (void)*reinterpret_cast<const volatile uint8_t*>(Ptr(s->pool().address) + 2 * kBlockBytes),
      "")
      << "left mapped (read-write) after the refusal";
  EXPECT_TRUE(s->MapForReading(2, 4, kBlockBytes, kBlocks).ok()) << "nothing left counted as read";
}

// The session says how its weights are mapped: read-only, or read-write where the driver
// refused read-only access (the SDK's log line says which).
TEST_F(DeviceMemoryTest, TheWeightsViewSaysWhetherTheyAreMappedReadOnly) {
  std::unique_ptr<DeviceSession> plain = Borrow();
  ASSERT_NE(plain, nullptr);
  EXPECT_TRUE(plain->weights().read_only);
  ::setenv("BATON_FAKE_CUDA_NO_READ_ONLY", "1", 1);
  std::unique_ptr<DeviceSession> refused = Borrow();
  ::unsetenv("BATON_FAKE_CUDA_NO_READ_ONLY");
  ASSERT_NE(refused, nullptr);
  EXPECT_FALSE(refused->weights().read_only);
}

TEST_F(DeviceMemoryTest, ProbeSeesALostAndAHungDevice) {
  EXPECT_TRUE(owner_->Probe(1s).ok());
  const std::string lost = "/tmp/baton-probe-lost-" + std::to_string(::getpid());
  const std::string hung = "/tmp/baton-probe-hung-" + std::to_string(::getpid());
  ::setenv("BATON_FAKE_CUDA_LOST", lost.c_str(), 1);
  ::setenv("BATON_FAKE_CUDA_HUNG", hung.c_str(), 1);
  std::ofstream(lost).close();
  Status failed = owner_->Probe(1s);
  EXPECT_NE(failed.message().find("CUDA_ERROR_ECC_UNCORRECTABLE"), std::string::npos)
      << failed.ToString();
  std::remove(lost.c_str());
  std::ofstream(hung).close();
  Status stuck = owner_->Probe(50ms);
  EXPECT_EQ(stuck.code(), StatusCode::kDeadlineExceeded) << stuck.ToString();
  std::remove(hung.c_str());
  EXPECT_TRUE(owner_->Probe(1s).ok());
  ::unsetenv("BATON_FAKE_CUDA_LOST");
  ::unsetenv("BATON_FAKE_CUDA_HUNG");
}

TEST_F(DeviceMemoryTest, AHostEngineDeclinesAndTheOwnerHearsWhy) {
  auto pair = proto::Channel::Pair(io_);
  ASSERT_TRUE(pair.ok());
  ASSERT_TRUE(owner_->Share(pair->first).ok());
  Result<uint64_t> chunk =
      DeviceSession::Decline(pair->second, kDeviceRegionCount, "computes on the host", 5s);
  ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
  EXPECT_EQ(*chunk, owner_->stats().pool_chunk_bytes) << "the pool's chunk, to reclaim by";
  for (int i = 0; i < 2; ++i) {
    Result<proto::ReceivedMessage> msg = pair->first.Receive(5s);
    ASSERT_TRUE(msg.ok());
    Result<proto::ShareMemoryAck> ack = msg->As<proto::ShareMemoryAck>();
    ASSERT_TRUE(ack.ok());
    EXPECT_FALSE(ack->mapped);
    EXPECT_NE(ack->detail.find("declined: computes on the host"), std::string::npos) << ack->detail;
  }
}

}  // namespace
}  // namespace baton
