#include "proto/messages.h"

#include <gtest/gtest.h>

#include <cereal/archives/portable_binary.hpp>
#include <sstream>
#include <string>

namespace baton::proto {
namespace {

template <typename T>
T RoundTrip(const T& msg) {
  Result<std::string> payload = Encode(msg);
  EXPECT_TRUE(payload.ok()) << payload.status().ToString();
  Result<T> back = Decode<T>(*payload);
  EXPECT_TRUE(back.ok()) << back.status().ToString();
  return back.ok() ? *back : T{};
}

TensorTable SampleTable() {
  TensorTable table{.model = "llama-tiny", .arena_size = 1 << 20, .tensors = {}};
  table.tensors.push_back({.name = "model.embed_tokens.weight",
                           .dtype = 4,
                           .shape = {32000, 64},
                           .offset = 0,
                           .size = 32000 * 64 * 2});
  table.tensors.push_back(
      {.name = "lm_head.weight", .dtype = 2, .shape = {-1, 7, 0}, .offset = 4096, .size = 8});
  return table;
}

TEST(MessagesTest, RoundTripEachMessage) {
  Hello hello{.min_version = 1,
              .max_version = 3,
              .peer_name = "engine-a",
              .role = PeerRole::kEngine,
              .launch_token = "t0k3n"};
  Hello h2 = RoundTrip(hello);
  EXPECT_EQ(h2.min_version, 1);
  EXPECT_EQ(h2.max_version, 3);
  EXPECT_EQ(h2.peer_name, "engine-a");
  EXPECT_EQ(h2.role, PeerRole::kEngine);
  EXPECT_EQ(h2.launch_token, "t0k3n");

  EXPECT_EQ(RoundTrip(HelloAck{.version = 2, .server_name = "ctl"}).server_name, "ctl");
  EXPECT_EQ(RoundTrip(HelloReject{.reason = "no"}).reason, "no");
  Heartbeat hb = RoundTrip(Heartbeat{.epoch = 1ull << 40, .seq = 99});
  EXPECT_EQ(hb.epoch, 1ull << 40);
  EXPECT_EQ(hb.seq, 99u);

  ShareMemory sm = RoundTrip(ShareMemory{
      .name = "arena", .size = 123456789012ull, .kind = 2, .huge_pages = true, .writable = true});
  EXPECT_EQ(sm.name, "arena");
  EXPECT_EQ(sm.size, 123456789012ull);
  EXPECT_EQ(sm.kind, 2);
  EXPECT_TRUE(sm.huge_pages);
  EXPECT_TRUE(sm.writable);

  ShareMemoryAck ack = RoundTrip(ShareMemoryAck{.name = "arena", .mapped = false, .detail = "x"});
  EXPECT_FALSE(ack.mapped);
  EXPECT_EQ(ack.detail, "x");

  TensorTable table = SampleTable();
  TensorTable back = RoundTrip(table);
  EXPECT_EQ(back.model, table.model);
  EXPECT_EQ(back.arena_size, table.arena_size);
  EXPECT_EQ(back.tensors, table.tensors);
}

TEST(MessagesTest, ErrorMsgCarriesStatus) {
  const Status original = DataLoss("checksum of shard 3 differs");
  ErrorMsg msg = RoundTrip(ErrorMsg::FromStatus(original));
  const Status back = msg.ToStatus();
  EXPECT_EQ(back.code(), StatusCode::kDataLoss);
  EXPECT_EQ(back.message(), original.message());
  const ErrorMsg unknown_code{.code = 9999, .message = "m"};
  EXPECT_EQ(unknown_code.ToStatus().code(), StatusCode::kInternal);
  const ErrorMsg ok_code{.code = 0, .message = "m"};
  EXPECT_EQ(ok_code.ToStatus().code(), StatusCode::kInternal);
}

TEST(MessagesTest, PayloadStartsWithLittleEndianMarker) {
  Result<std::string> payload = Encode(Heartbeat{.epoch = 1, .seq = 2});
  ASSERT_TRUE(payload.ok());
  ASSERT_EQ(payload->size(), 17u);
  EXPECT_EQ((*payload)[0], 1);
  EXPECT_EQ((*payload)[1], 1);  // epoch, least significant byte first
  EXPECT_EQ((*payload)[9], 2);
}

TEST(MessagesTest, DecodesBigEndianPayloads) {
  std::ostringstream out(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(
        out, cereal::PortableBinaryOutputArchive::Options::BigEndian());
    Hello hello{.min_version = 1,
                .max_version = 258,
                .peer_name = "be",
                .role = PeerRole::kRouter,
                .launch_token = ""};
    ar(hello);
  }
  Result<Hello> hello = Decode<Hello>(out.str());
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_EQ(hello->max_version, 258);
  EXPECT_EQ(hello->peer_name, "be");
}

TEST(MessagesTest, RefusesTruncation) {
  Result<std::string> payload = Encode(SampleTable());
  ASSERT_TRUE(payload.ok());
  for (size_t len = 0; len < payload->size(); ++len) {
    Result<TensorTable> t = Decode<TensorTable>(std::string_view(*payload).substr(0, len));
    ASSERT_FALSE(t.ok()) << "prefix of " << len << " bytes decoded";
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("malformed TensorTable payload"), std::string::npos);
  }
}

TEST(MessagesTest, RefusesTrailingBytes) {
  Result<std::string> payload = Encode(Heartbeat{.epoch = 1, .seq = 2});
  ASSERT_TRUE(payload.ok());
  Result<Heartbeat> hb = Decode<Heartbeat>(*payload + "zz");
  ASSERT_FALSE(hb.ok());
  EXPECT_NE(hb.status().message().find("2 trailing bytes"), std::string::npos)
      << hb.status().message();
}

TEST(MessagesTest, RefusesLengthPrefixBeyondPayload) {
  // HelloReject{reason} whose string claims 2^40 bytes: refused without allocating them.
  std::string payload("\x01", 1);
  const uint64_t huge = 1ull << 40;
  payload.append(reinterpret_cast<const char*>(&huge), sizeof(huge));
  payload += "short";
  Result<HelloReject> r = Decode<HelloReject>(payload);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("length prefix 1099511627776"), std::string::npos)
      << r.status().message();
}

TEST(MessagesTest, RefusesBadBoolAndEndianness) {
  Result<std::string> payload = Encode(ShareMemoryAck{.name = "n", .mapped = true, .detail = ""});
  ASSERT_TRUE(payload.ok());
  std::string bad_bool = *payload;
  bad_bool[1 + 8 + 1] = 7;  // marker, name length, 'n', then the bool
  EXPECT_NE(Decode<ShareMemoryAck>(bad_bool).status().message().find("bad bool value 7"),
            std::string::npos);
  std::string bad_marker = *payload;
  bad_marker[0] = 2;
  EXPECT_NE(Decode<ShareMemoryAck>(bad_marker).status().message().find("endianness"),
            std::string::npos);
}

TEST(MessagesTest, RegistryAndDecodeAny) {
  EXPECT_TRUE(IsKnownMsgType(1));
  EXPECT_TRUE(IsKnownMsgType(static_cast<uint16_t>(MsgType::kTensorTable)));
  EXPECT_FALSE(IsKnownMsgType(0));
  EXPECT_FALSE(IsKnownMsgType(999));
  EXPECT_EQ(MsgTypeName(MsgType::kShareMemory), "ShareMemory");
  EXPECT_EQ(MsgTypeName(999), "unknown type 999");

  Result<std::string> payload = Encode(Heartbeat{.epoch = 5, .seq = 6});
  ASSERT_TRUE(payload.ok());
  Result<AnyMessage> any = DecodeAny(static_cast<uint16_t>(MsgType::kHeartbeat), *payload);
  ASSERT_TRUE(any.ok());
  ASSERT_TRUE(std::holds_alternative<Heartbeat>(*any));
  EXPECT_EQ(std::get<Heartbeat>(*any).seq, 6u);
  EXPECT_FALSE(DecodeAny(static_cast<uint16_t>(MsgType::kHello), *payload).ok());
  EXPECT_NE(DecodeAny(999, *payload).status().message().find("unknown message type 999"),
            std::string::npos);
}

}  // namespace
}  // namespace baton::proto
