// A VMM region's chunks over a real proto::Channel (SCM_RIGHTS): names, order, one fd each,
// and the ack. memfds stand in for the CUDA fds, which the transport does not look into.
#include "cuda/memory/vmm_share.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <boost/asio/io_context.hpp>

#include "proto/messages.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

UniqueFd Memfd() { return UniqueFd(::memfd_create("vmm-share-test", MFD_CLOEXEC)); }

ino_t Inode(int fd) {
  struct stat st {};
  ::fstat(fd, &st);
  return st.st_ino;
}

TEST(VmmShareTest, ChunkNames) {
  EXPECT_EQ(VmmChunkName("pool", 3, 128), "pool[3/128]");
  Result<VmmChunkRef> ref = ParseVmmChunkName("weights[0/64]");
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->region, "weights");
  EXPECT_EQ(ref->index, 0u);
  EXPECT_EQ(ref->count, 64u);
  EXPECT_EQ(ParseVmmChunkName("a[b][1/2]")->region, "a[b]");
  for (const char* bad : {"pool", "[0/1]", "pool[1/1]", "pool[0/0]", "pool[x/2]", "pool[1/2]x",
                          "pool[/2]", "pool[1/]", "pool[0/2000000]", "pool[-1/2]", "pool[1 /2]"}) {
    EXPECT_FALSE(ParseVmmChunkName(bad).ok()) << bad;
  }
}

class VmmShareChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = proto::Channel::Pair(io_);
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    owner_.emplace(std::move(pair->first));
    borrower_.emplace(std::move(pair->second));
  }
  boost::asio::io_context io_;
  std::optional<proto::Channel> owner_;
  std::optional<proto::Channel> borrower_;
};

TEST_F(VmmShareChannelTest, ARegionArrivesWholeAndInOrder) {
  std::vector<UniqueFd> fds;
  std::vector<int> raw;
  for (int i = 0; i < 3; ++i) {
    fds.push_back(Memfd());
    raw.push_back(fds.back().get());
  }
  VmmRegionInfo info{.name = "pool", .chunk_bytes = 256u << 20, .chunk_count = 3, .writable = true};
  ASSERT_TRUE(SendVmmRegion(*owner_, info, raw).ok());
  Result<ReceivedVmmRegion> got = ReceiveVmmRegion(*borrower_, 5s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->info.name, "pool");
  EXPECT_EQ(got->info.chunk_bytes, 256u << 20);
  EXPECT_EQ(got->info.chunk_count, 3u);
  EXPECT_TRUE(got->info.writable);
  ASSERT_EQ(got->fds.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Inode(got->fds[i].get()), Inode(raw[i])) << i;

  ASSERT_TRUE(AckVmmRegion(*borrower_, "pool", OkStatus()).ok());
  EXPECT_TRUE(WaitVmmAck(*owner_, "pool", 5s).ok());
  ASSERT_TRUE(AckVmmRegion(*borrower_, "pool",
                           Unavailable("cuMemImportFromShareableHandle: "
                                       "CUDA_ERROR_INVALID_VALUE"))
                  .ok());
  Status refused = WaitVmmAck(*owner_, "pool", 5s);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("CUDA_ERROR_INVALID_VALUE"), std::string::npos);
}

TEST_F(VmmShareChannelTest, FdCountMustMatch) {
  UniqueFd fd = Memfd();
  const int raw[] = {fd.get()};
  EXPECT_EQ(SendVmmRegion(*owner_, {.name = "w", .chunk_bytes = 1, .chunk_count = 2}, raw).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(VmmShareChannelTest, MemfdKindIsRefused) {
  UniqueFd fd = Memfd();
  const int raw[] = {fd.get()};
  ASSERT_TRUE(
      owner_
          ->Send(proto::ShareMemory{.name = "w[0/1]",
                                    .size = 4096,
                                    .kind = static_cast<uint8_t>(proto::MemoryKind::kMemfd)},
                 raw)
          .ok());
  Result<ReceivedVmmRegion> got = ReceiveVmmRegion(*borrower_, 5s);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("is not of kind CUDA VMM"), std::string::npos);
}

TEST_F(VmmShareChannelTest, OutOfOrderChunksAreRefused) {
  UniqueFd fd = Memfd();
  const int raw[] = {fd.get()};
  const uint8_t vmm = static_cast<uint8_t>(proto::MemoryKind::kCudaVmm);
  ASSERT_TRUE(
      owner_->Send(proto::ShareMemory{.name = "w[0/2]", .size = 4096, .kind = vmm}, raw).ok());
  ASSERT_TRUE(
      owner_->Send(proto::ShareMemory{.name = "w[0/2]", .size = 4096, .kind = vmm}, raw).ok());
  Result<ReceivedVmmRegion> got = ReceiveVmmRegion(*borrower_, 5s);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("does not follow chunk 1 of region 'w'"), std::string::npos)
      << got.status().message();
}

TEST_F(VmmShareChannelTest, TwoFdsInOneChunkAreRefused) {
  UniqueFd a = Memfd();
  UniqueFd b = Memfd();
  const int raw[] = {a.get(), b.get()};
  const uint8_t vmm = static_cast<uint8_t>(proto::MemoryKind::kCudaVmm);
  ASSERT_TRUE(
      owner_->Send(proto::ShareMemory{.name = "w[0/1]", .size = 4096, .kind = vmm}, raw).ok());
  Result<ReceivedVmmRegion> got = ReceiveVmmRegion(*borrower_, 5s);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("came with 2 fds"), std::string::npos);
}

TEST_F(VmmShareChannelTest, SilenceTimesOut) {
  Result<ReceivedVmmRegion> got = ReceiveVmmRegion(*borrower_, 20ms);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace baton
