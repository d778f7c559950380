// Runs the real baton-refengine binary under a scripted controller: the test listens on the
// controller socket, registers the engine with a weight arena and a pool of its own, and
// drives it through standby, promotion, grants, a reclaim, a drain and a stop, and through a
// controller restart (the engine serves on and reattaches to the next one).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "proto/hello.h"
#include "proto/messages.h"
#include "proto/transport/listener.h"
#include "proto/transport/shared_memory.h"
#include "standby/mkmodel/model_writer.h"
#include "tests/proto/http/http_test_client.h"
#include "tests/standby/refengine_testutil.h"
#include "weightcache/model_files.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr uint32_t kBlocks = 64;
constexpr uint64_t kBlockBytes = 16384;
constexpr char kToken[] = "launch-token-1";

// The controller's side of one engine connection, done step by step by the test.
class ScriptedController {
 public:
  explicit ScriptedController(const std::string& socket) {
    Result<proto::Listener> listener = proto::Listener::Bind(io_, socket);
    EXPECT_TRUE(listener.ok()) << listener.status().ToString();
    if (listener.ok()) listener_.emplace(std::move(listener).value());
  }

  // The model's tensors copied into a memfd arena, as the weight cache would hold them.
  void LoadArena(const std::string& model_dir) {
    Result<ModelFiles> files = ModelFiles::Open(model_dir);
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    uint64_t size = 0;
    for (const SafetensorsIndex& shard : files->shards()) size += shard.data_size() + 64;
    Result<SharedMemory> arena = SharedMemory::Create({"test-arena", size, false});
    ASSERT_TRUE(arena.ok());
    Result<Mapping> map = arena->Map(Protection::kReadWrite);
    ASSERT_TRUE(map.ok());
    uint64_t base = 0;
    for (const SafetensorsIndex& shard : files->shards()) {
      std::string bytes = ReadWholeFile(shard.path()).substr(shard.data_offset());
      std::memcpy(map->data() + base, bytes.data(), bytes.size());
      for (const TensorInfo& t : shard.tensors()) {
        tensors_.push_back(
            {t.name, static_cast<uint8_t>(t.dtype), t.shape, base + t.begin, t.size()});
      }
      base += (shard.data_size() + 63) / 64 * 64;
    }
    arena_size_ = size;
    arena_.emplace(std::move(arena).value());
    Result<SharedMemory> pool = SharedMemory::Create({"test-pool", kBlocks * kBlockBytes, false});
    ASSERT_TRUE(pool.ok());
    pool_.emplace(std::move(pool).value());
  }

  // Hello, Register, RegisterAck with the arena and pool fds, StandbyReady.
  Result<proto::Register> AcceptEngine() {
    BATON_ASSIGN_OR_RETURN(proto::Channel channel, listener_->Accept(std::chrono::seconds(60)));
    channel_.emplace(std::move(channel));
    proto::ServerHelloOptions hello{.server_name = "test-controller"};
    hello.admit = [](const proto::Hello& h) {
      return h.launch_token == kToken ? OkStatus() : FailedPrecondition("bad token");
    };
    BATON_RETURN_IF_ERROR(proto::ServerHello(*channel_, hello).status());
    proto::Register reg = Expect<proto::Register>();
    proto::RegisterAck ack{.engine_id = reg.engine_id,
                           .model = "tiny",
                           .arena_size = arena_size_,
                           .tensors = tensors_,
                           .block_count = kBlocks,
                           .block_bytes = kBlockBytes,
                           .reserve_bytes = kBlocks * kBlockBytes};
    const int fds[] = {arena_->fd(), pool_->fd()};
    BATON_RETURN_IF_ERROR(channel_->Send(ack, fds));
    (void)Expect<proto::StandbyReady>();
    return reg;
  }

  // Hello and the Reattach of an engine that outlived the previous controller.
  Result<proto::Reattach> AcceptReattach() {
    BATON_ASSIGN_OR_RETURN(proto::Channel channel, listener_->Accept(std::chrono::seconds(60)));
    channel_.emplace(std::move(channel));
    BATON_RETURN_IF_ERROR(
        proto::ServerHello(*channel_, {.server_name = "next-test-controller"}).status());
    Result<proto::ReceivedMessage> msg = channel_->Receive(std::chrono::seconds(30));
    if (!msg.ok()) return msg.status();
    return msg->As<proto::Reattach>();
  }

  // The next message other than a Progress, which must be a Heartbeat.
  proto::Heartbeat NextHeartbeat() {
    Result<proto::ReceivedMessage> msg = channel_->Receive(std::chrono::seconds(30));
    while (msg.ok() && msg->type == proto::MsgType::kProgress) {
      msg = channel_->Receive(std::chrono::seconds(30));
    }
    EXPECT_TRUE(msg.ok()) << msg.status().ToString();
    Result<proto::Heartbeat> beat =
        msg.ok() ? msg->As<proto::Heartbeat>() : Result<proto::Heartbeat>(msg.status());
    EXPECT_TRUE(beat.ok()) << beat.status().ToString();
    return beat.ok() ? *beat : proto::Heartbeat{};
  }

  // The controller crashes: the connection and the listening socket close.
  void GoAway() {
    if (channel_.has_value()) channel_->Close();
    if (listener_.has_value()) listener_->Close();
  }

  // (st_dev, st_ino) of the arena's memfd, as a Reattach names it.
  std::pair<uint64_t, uint64_t> arena_identity() const {
    struct stat st {};
    EXPECT_EQ(::fstat(arena_->fd(), &st), 0);
    return {st.st_dev, st.st_ino};
  }

  template <typename T>
  void Send(const T& msg) {
    EXPECT_TRUE(channel_->Send(msg).ok());
  }

  // The next message of type T, skipping heartbeats.
  template <typename T>
  T Expect() {
    while (true) {
      Result<proto::ReceivedMessage> msg = channel_->Receive(std::chrono::seconds(30));
      EXPECT_TRUE(msg.ok()) << msg.status().ToString();
      if (!msg.ok()) return T{};
      if (msg->type == proto::MsgType::kHeartbeat || msg->type == proto::MsgType::kProgress) {
        continue;
      }
      Result<T> decoded = msg->As<T>();
      EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
      return decoded.ok() ? *decoded : T{};
    }
  }

 private:
  boost::asio::io_context io_;
  std::optional<proto::Listener> listener_;
  std::optional<proto::Channel> channel_;
  std::optional<SharedMemory> arena_;
  std::optional<SharedMemory> pool_;
  std::vector<proto::TensorEntry> tensors_;
  uint64_t arena_size_ = 0;
};

class RefEngineControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "baton-refengine-ctl-XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
    ModelSpec spec = PresetSpec("tiny");
    spec.seed = 5;
    ASSERT_TRUE(WriteModel(spec, dir_ + "/model").ok());
    fs::create_directory(dir_ + "/standalone");
    fs::create_directory(dir_ + "/engine");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::vector<std::string> EngineArgs() const {
    return {"--model", dir_ + "/model", "--served-model-name",
            "tiny",    "--controller",  dir_ + "/ctl.sock",
            "--token", kToken,          "--role",
            "standby", "--engine-id",   "7"};
  }

  std::string dir_;
};

HttpReply Complete(uint16_t port, const Json& body) {
  TestHttpClient client(port);
  return client.Post("/v1/completions", body.dump());
}

TEST_F(RefEngineControllerTest, StandbyServesOncePromotedWithTheControllersMemory) {
  const Json request = {
      {"prompt", "same weights"}, {"max_tokens", 20}, {"seed", 77}, {"temperature", 0.7}};
  std::string expected;
  {
    EngineProcess standalone(dir_ + "/standalone",
                             {"--model", dir_ + "/model", "--served-model-name", "tiny"});
    HttpReply r = Complete(standalone.port(), request);
    ASSERT_EQ(r.status, 200) << r.body;
    expected = Json::parse(r.body)["choices"][0]["token_ids"].dump();
  }

  ScriptedController ctl(dir_ + "/ctl.sock");
  ctl.LoadArena(dir_ + "/model");
  EngineProcess engine(dir_ + "/engine", EngineArgs());
  ASSERT_NE(engine.port(), 0);
  Result<proto::Register> reg = ctl.AcceptEngine();
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(reg->engine_id, 7u);
  EXPECT_EQ(reg->http_address, "127.0.0.1:" + std::to_string(engine.port()));

  // A standby: not serving.
  TestHttpClient client(engine.port());
  HttpReply health = client.Get("/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.body, R"({"status":"standby"})");
  HttpReply refused = client.Post("/v1/completions", request.dump());
  EXPECT_EQ(refused.status, 503);
  EXPECT_TRUE(Json::parse(refused.body).contains("error"));

  ctl.Send(proto::Promote{.epoch = 3, .extents = {{0, 32}}});
  // It reads the inherited blocks' KV records first: fresh blocks hold none.
  const proto::KvAdopted adopted = ctl.Expect<proto::KvAdopted>();
  EXPECT_EQ(adopted.epoch, 3u);
  EXPECT_EQ(adopted.adopted, 0u);
  EXPECT_TRUE(adopted.dropped_reasons.empty());
  proto::PromoteAck ack = ctl.Expect<proto::PromoteAck>();
  EXPECT_EQ(ack.epoch, 3u);
  EXPECT_EQ(ack.blocks_mapped, 32u);
  EXPECT_EQ(client.Get("/health").status, 200);  // serving before the ack was sent
  HttpReply served = client.Post("/v1/completions", request.dump());
  ASSERT_EQ(served.status, 200) << served.body;
  EXPECT_EQ(Json::parse(served.body)["choices"][0]["token_ids"].dump(), expected);

  ctl.Send(proto::Grant{.epoch = 3, .extents = {{32, 16}}});
  EXPECT_TRUE(engine.WaitForLog("kv cache now holds 48 blocks")) << engine.log();
  ctl.Send(proto::Reclaim{.epoch = 3, .blocks = 8});
  proto::ReturnExtents returned = ctl.Expect<proto::ReturnExtents>();
  uint32_t count = 0;
  for (const proto::BlockRange& r : returned.extents) count += r.count;
  EXPECT_EQ(count, 8u);
  EXPECT_EQ(returned.epoch, 3u);
  EXPECT_EQ(Complete(engine.port(), request).status, 200);  // still serves on fewer blocks

  ctl.Send(proto::Drain{.epoch = 3, .timeout_ms = 5000});
  EXPECT_EQ(ctl.Expect<proto::Drained>().unfinished, 0u);
  EXPECT_EQ(client.Get("/health").body, R"({"status":"stopping"})");
  EXPECT_EQ(Complete(engine.port(), request).status, 503) << "a drained engine admits nothing";
  // The drain is called off (the switch-over's standby failed): the engine serves again.
  ctl.Send(proto::Resume{.epoch = 3});
  EXPECT_TRUE(engine.WaitForLog("serving again")) << engine.log();
  EXPECT_EQ(client.Get("/health").status, 200);
  HttpReply resumed = client.Post("/v1/completions", request.dump());
  ASSERT_EQ(resumed.status, 200) << resumed.body;
  EXPECT_EQ(Json::parse(resumed.body)["choices"][0]["token_ids"].dump(), expected);
  ctl.Send(proto::Drain{.epoch = 3, .timeout_ms = 5000});
  EXPECT_EQ(ctl.Expect<proto::Drained>().unfinished, 0u);
  ctl.Send(proto::Stop{.reason = "test over"});
  EXPECT_EQ(engine.WaitForExit(), 0) << engine.log();
}

// The controller crashes: the primary serves on with its blocks, and reattaches to the next
// controller as serving, at its epoch, with its blocks and the same memory.
TEST_F(RefEngineControllerTest, APrimaryServesOnThroughAControllerRestart) {
  const Json request = {{"prompt", "through a restart"}, {"max_tokens", 8}, {"seed", 3}};
  ScriptedController first(dir_ + "/ctl.sock");
  first.LoadArena(dir_ + "/model");
  EngineProcess engine(dir_ + "/engine", EngineArgs());
  ASSERT_NE(engine.port(), 0);
  ASSERT_TRUE(first.AcceptEngine().ok());
  first.Send(proto::Promote{.epoch = 4, .extents = {{0, 32}}});
  EXPECT_EQ(first.Expect<proto::KvAdopted>().epoch, 4u);
  EXPECT_EQ(first.Expect<proto::PromoteAck>().epoch, 4u);
  ASSERT_EQ(Complete(engine.port(), request).status, 200);

  first.GoAway();
  EXPECT_TRUE(engine.WaitForLog("the controller is away")) << engine.log();
  HttpReply away = Complete(engine.port(), request);
  EXPECT_EQ(away.status, 200) << "serves on while no controller listens: " << away.body;

  ScriptedController second(dir_ + "/ctl.sock");
  Result<proto::Reattach> r = second.AcceptReattach();
  ASSERT_TRUE(r.ok()) << r.status().ToString() << "\n" << engine.log();
  EXPECT_EQ(r->engine_id, 7u);
  EXPECT_EQ(r->role, static_cast<uint8_t>(proto::ReattachRole::kServing));
  EXPECT_EQ(r->epoch, 4u);
  EXPECT_EQ(r->extents, (std::vector<proto::BlockRange>{{0, 32}}));
  EXPECT_EQ(std::make_pair(r->arena_dev, r->arena_ino), first.arena_identity());
  second.Send(proto::ReattachAck{.engine_id = 7, .heartbeat_interval_ms = 100});
  EXPECT_TRUE(engine.WaitForLog("the controller is back")) << engine.log();
  EXPECT_EQ(second.NextHeartbeat().epoch, 4u) << "heartbeats resume";
  EXPECT_EQ(Complete(engine.port(), request).status, 200);
  second.Send(proto::Stop{.reason = "test over"});
  EXPECT_EQ(engine.WaitForExit(), 0) << engine.log();
}

TEST_F(RefEngineControllerTest, StandbyStoppedBeforePromotionExitsCleanly) {
  ScriptedController ctl(dir_ + "/ctl.sock");
  ctl.LoadArena(dir_ + "/model");
  EngineProcess engine(dir_ + "/engine", EngineArgs());
  ASSERT_TRUE(ctl.AcceptEngine().ok());
  ctl.Send(proto::Stop{.reason = "not needed"});
  EXPECT_EQ(engine.WaitForExit(), 0) << engine.log();
  EXPECT_NE(engine.log().find("not needed"), std::string::npos);
}

TEST_F(RefEngineControllerTest, WrongLaunchTokenFails) {
  ScriptedController ctl(dir_ + "/ctl.sock");
  ctl.LoadArena(dir_ + "/model");
  std::vector<std::string> args = EngineArgs();
  args[7] = "wrong-token";
  EngineProcess engine(dir_ + "/engine", args);
  Result<proto::Register> reg = ctl.AcceptEngine();
  EXPECT_FALSE(reg.ok());
  EXPECT_EQ(engine.WaitForExit(), 1) << engine.log();
  EXPECT_NE(engine.log().find("bad token"), std::string::npos) << engine.log();
}

}  // namespace
}  // namespace baton
