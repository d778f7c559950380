// libbaton_torch_alloc.so as a PyTorch engine would use it, on the emulated device: the
// engine connects through libbaton_engine.so's C ABI with device memory, is promoted by a
// scripted controller that owns real device regions (cuda/device_owner.h), attaches the
// allocator, and gets block-aligned device addresses inside the device pool that it can
// write; a refresh after blocks were returned while allocated says so, and only held blocks
// are handed out afterwards.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <future>

#include "cuda/device_owner.h"
#include "cuda/device_session.h"
#include "standby/sdk/baton_torch_alloc.h"
#include "tests/cuda_emulated/emulated_device.h"
#include "tests/standby/fake_controller.h"

namespace baton {
namespace {

using namespace std::chrono_literals;
using testing::FakeController;
using testing::kFakeBlockBytes;
using testing::kFakeBlocks;

class Library {
 public:
  explicit Library(const std::string& path) : handle_(::dlopen(path.c_str(), RTLD_NOW)) {}
  ~Library() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  template <typename F>
  F* Symbol(const char* name) const {
    return reinterpret_cast<F*>(::dlsym(handle_, name));
  }
  bool ok() const { return handle_ != nullptr; }

 private:
  void* handle_;
};

TEST(TorchAllocTest, AllocatesInsideTheDevicePoolBlocksTheEngineHolds) {
  Library lib(std::string(BATON_LIB_DIR) + "/libbaton_torch_alloc.so");
  ASSERT_TRUE(lib.ok()) << ::dlerror();
  auto* connect = lib.Symbol<decltype(baton_engine_connect_flags)>("baton_engine_connect_flags");
  auto* wait = lib.Symbol<decltype(baton_engine_wait_promotion)>("baton_engine_wait_promotion");
  auto* close = lib.Symbol<decltype(baton_engine_close)>("baton_engine_close");
  auto* ret = lib.Symbol<decltype(baton_engine_return_blocks)>("baton_engine_return_blocks");
  auto* attach = lib.Symbol<decltype(baton_torch_alloc_attach)>("baton_torch_alloc_attach");
  auto* refresh = lib.Symbol<decltype(baton_torch_alloc_refresh)>("baton_torch_alloc_refresh");
  auto* tmalloc = lib.Symbol<decltype(baton_torch_malloc)>("baton_torch_malloc");
  auto* tfree = lib.Symbol<decltype(baton_torch_free)>("baton_torch_free");
  auto* free_bytes =
      lib.Symbol<decltype(baton_torch_alloc_free_bytes)>("baton_torch_alloc_free_bytes");
  ASSERT_TRUE(connect && wait && close && ret && attach && refresh && tmalloc && tfree &&
              free_bytes);

  std::vector<uint8_t> arena(8192, 7);
  Result<std::unique_ptr<DeviceOwner>> owner =
      DeviceOwner::Create({.device = 0, .block_count = kFakeBlocks, .block_bytes = kFakeBlockBytes},
                          std::span<uint8_t>(arena));
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  FakeController fake;
  const EngineSessionOptions o = fake.Options();
  baton_engine_options opts{.socket_path = o.launch.socket_path.c_str(),
                            .launch_token = o.launch.launch_token.c_str(),
                            .engine_id = o.launch.engine_id,
                            .engine_version = "sdk-test",
                            .http_address = nullptr,
                            .prefault_weights = 1,
                            .connect_timeout_ms = 5000};
  baton_engine* engine = nullptr;
  auto connected = std::async(
      std::launch::async, [&] { return connect(&opts, BATON_ENGINE_USE_DEVICE_MEMORY, &engine); });
  proto::RegisterAck ack = fake.Ack(50);
  ack.device = 0;
  ack.device_regions = kDeviceRegionCount;
  fake.ServeRegistration(ack, 2, /*expect_ready=*/false);
  ASSERT_TRUE((*owner)->Share(fake.channel()).ok());
  EXPECT_TRUE(fake.Expect<proto::ShareMemoryAck>().mapped);
  EXPECT_TRUE(fake.Expect<proto::ShareMemoryAck>().mapped);
  fake.Expect<proto::StandbyReady>();
  ASSERT_EQ(connected.get(), 0);

  ASSERT_TRUE(fake.channel().Send(proto::Promote{.epoch = 3, .extents = {{0, 4}}}).ok());
  baton_event ev;
  ASSERT_EQ(wait(engine, 5000, &ev), 0);
  ASSERT_EQ(attach(engine), 0);
  EXPECT_EQ(free_bytes(), 4 * kFakeBlockBytes);
  EXPECT_EQ(tmalloc(100, /*device=*/1, nullptr), nullptr) << "another device";
  auto* a = static_cast<uint8_t*>(tmalloc(kFakeBlockBytes + 1, 0, nullptr));  // 2 blocks
  auto* b = static_cast<uint8_t*>(tmalloc(kFakeBlockBytes, 0, nullptr));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b - a, static_cast<ptrdiff_t>(2 * kFakeBlockBytes));
  EXPECT_EQ(tmalloc(2 * kFakeBlockBytes, 0, nullptr), nullptr) << "1 block left";
  std::memset(a, 0x5A, 2 * kFakeBlockBytes);  // the emulated device's memory is host memory

  baton_extent give{.first = 0, .count = 2, .data = nullptr, .bytes = 0};
  ASSERT_EQ(ret(engine, &give, 1), 0);
  EXPECT_NE(refresh(), 0) << "blocks 0 and 1 went back while allocated";
  EXPECT_EQ(free_bytes(), kFakeBlockBytes) << "only block 3 is held and free";
  tfree(a, kFakeBlockBytes + 1, 0, nullptr);
  EXPECT_EQ(refresh(), 0);
  EXPECT_EQ(free_bytes(), kFakeBlockBytes) << "block 3 is free, block 2 is b's";
  tfree(b, kFakeBlockBytes, 0, nullptr);
  close(engine);
}

}  // namespace
}  // namespace baton
