// The device memory a controller leaves with baton-keeper (cuda/device_owner.h
// ExportForKeeping, Adopt) on the emulated device: the chunk fds outlive the owner that made
// them, a new owner adopts them without copying (the weights equal to the arena, the pool's
// bytes as they were left), shares them with engines, and refuses memory that is not what its
// arena and geometry ask for.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <cstring>
#include <vector>

#include "cuda/device_owner.h"
#include "cuda/device_session.h"
#include "proto/messages.h"
#include "tests/cuda_emulated/emulated_device.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kBlocks = 8;
constexpr uint64_t kBlockBytes = 1u << 20;
constexpr uint32_t kHeader = 64;

uint8_t* Ptr(uint64_t address) { return reinterpret_cast<uint8_t*>(address); }

class DeviceKeepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    arena_.resize(6u << 20);
    for (size_t i = 0; i < arena_.size(); ++i) arena_[i] = static_cast<uint8_t>(i * 13 + 5);
  }

  Result<std::unique_ptr<DeviceOwner>> Make() {
    return DeviceOwner::Create(options_, std::span<uint8_t>(arena_));
  }
  Result<std::unique_ptr<DeviceOwner>> Adopt(KeptDeviceMemory kept) {
    return DeviceOwner::Adopt(options_, std::span<uint8_t>(arena_), std::move(kept));
  }

  // An engine's session on `owner`, both regions accepted and acked.
  std::unique_ptr<DeviceSession> Borrow(DeviceOwner& owner) {
    auto pair = proto::Channel::Pair(io_);
    EXPECT_TRUE(pair.ok());
    if (!pair.ok()) return nullptr;
    EXPECT_TRUE(owner.Share(pair->first).ok());
    Result<std::unique_ptr<DeviceSession>> s =
        DeviceSession::Accept(pair->second, 0, kDeviceRegionCount, 5s);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    for (int i = 0; i < 2; ++i) {
      Result<proto::ReceivedMessage> msg = pair->first.Receive(5s);
      EXPECT_TRUE(msg.ok());
      if (!msg.ok()) return nullptr;
      Result<proto::ShareMemoryAck> ack = msg->As<proto::ShareMemoryAck>();
      EXPECT_TRUE(ack.ok() && ack->mapped) << ack->detail;
    }
    return s.ok() ? std::move(s).value() : nullptr;
  }

  // Made, written to by an engine, exported, and the owner and the engine gone.
  KeptDeviceMemory KeptAfterAnEngineWrote(uint8_t fill) {
    Result<std::unique_ptr<DeviceOwner>> owner = Make();
    EXPECT_TRUE(owner.ok()) << owner.status().ToString();
    if (!owner.ok()) return {};
    {
      std::unique_ptr<DeviceSession> s = Borrow(**owner);
      EXPECT_NE(s, nullptr);
      if (s == nullptr) return {};
      EXPECT_TRUE(s->MapBlocks(0, kBlocks, kBlockBytes, kBlocks, kHeader, 5s).ok());
      std::memset(Ptr(s->pool().address), fill, kBlocks * kBlockBytes);
    }
    Result<KeptDeviceMemory> kept = (*owner)->ExportForKeeping();
    EXPECT_TRUE(kept.ok()) << kept.status().ToString();
    return kept.ok() ? std::move(kept).value() : KeptDeviceMemory{};
  }

  DeviceOwnerOptions options_{.device = 0,
                              .block_count = kBlocks,
                              .block_bytes = kBlockBytes,
                              .weights_chunk_bytes = 4u << 20,
                              .pool_chunk_bytes = 2u << 20};
  boost::asio::io_context io_;
  std::vector<uint8_t> arena_;
};

TEST_F(DeviceKeepTest, AnAdoptedOwnerHasTheSameWeightsAndPoolBytesAndSharesThem) {
  KeptDeviceMemory kept = KeptAfterAnEngineWrote(0x5A);
  ASSERT_EQ(kept.weights.fds.size(), 2u);
  ASSERT_EQ(kept.pool.fds.size(), 4u);
  Result<std::unique_ptr<DeviceOwner>> adopted = Adopt(std::move(kept));
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  EXPECT_TRUE((*adopted)->stats().adopted);
  EXPECT_EQ((*adopted)->stats().pool_chunks, 4u);
  EXPECT_NE((*adopted)->Describe().find("not copied"), std::string::npos);
  EXPECT_TRUE((*adopted)->Probe(1s).ok());

  std::unique_ptr<DeviceSession> s = Borrow(**adopted);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(std::memcmp(Ptr(s->weights().address), arena_.data(), arena_.size()), 0);
  ASSERT_TRUE(s->MapBlocks(0, kBlocks, kBlockBytes, kBlocks, kHeader, 5s).ok());
  EXPECT_EQ(Ptr(s->pool().address)[kHeader], 0x5A) << "the pool's bytes were kept";
  EXPECT_EQ(Ptr(s->pool().address)[kBlocks * kBlockBytes - 1], 0x5A);

  // Kept again by the adopter (dups of what it imported), and adopted once more.
  Result<KeptDeviceMemory> again = (*adopted)->ExportForKeeping();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  s.reset();
  adopted->reset();
  Result<std::unique_ptr<DeviceOwner>> third = Adopt(std::move(again).value());
  ASSERT_TRUE(third.ok()) << third.status().ToString();
}

TEST_F(DeviceKeepTest, MemoryThatIsNotThisArenasIsRefused) {
  KeptDeviceMemory kept = KeptAfterAnEngineWrote(0);
  arena_[arena_.size() - 1] ^= 0xFF;  // another model's last byte
  Result<std::unique_ptr<DeviceOwner>> other = Adopt(std::move(kept));
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("differ from the arena"), std::string::npos)
      << other.status().ToString();
}

TEST_F(DeviceKeepTest, MemoryOfAnotherGeometryIsRefused) {
  {
    KeptDeviceMemory kept = KeptAfterAnEngineWrote(0);
    kept.pool.fds.pop_back();
    Result<std::unique_ptr<DeviceOwner>> short_pool = Adopt(std::move(kept));
    ASSERT_FALSE(short_pool.ok());
    EXPECT_NE(short_pool.status().message().find("kept device pool is 3 chunks"), std::string::npos)
        << short_pool.status().ToString();
  }
  {
    KeptDeviceMemory kept = KeptAfterAnEngineWrote(0);
    options_.pool_chunk_bytes = 4u << 20;  // the configuration changed
    Result<std::unique_ptr<DeviceOwner>> rechunked = Adopt(std::move(kept));
    ASSERT_FALSE(rechunked.ok());
    EXPECT_EQ(rechunked.status().code(), StatusCode::kFailedPrecondition);
  }
  {
    KeptDeviceMemory kept = KeptAfterAnEngineWrote(0);
    std::swap(kept.weights.fds, kept.pool.fds);  // pool chunks where weights should be
    kept.weights.fds.resize(2);
    kept.pool.fds.resize(4);
    Result<std::unique_ptr<DeviceOwner>> swapped = Adopt(std::move(kept));
    EXPECT_FALSE(swapped.ok()) << "2 MiB pool chunks do not map as 4 MiB weight chunks";
  }
}

}  // namespace
}  // namespace baton
