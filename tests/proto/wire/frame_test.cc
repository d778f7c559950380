#include "proto/wire/frame.h"

#include <gtest/gtest.h>

#include <string>

#include "proto/wire/crc32c.h"
#include "tests/proto/proto_test_util.h"

namespace baton::proto {
namespace {

using testing::HeaderFor;
using testing::RawFrame;

std::string MustEncode(uint16_t type, std::string_view payload, size_t fds = 0) {
  Result<std::string> frame = EncodeFrame(type, payload, fds);
  EXPECT_TRUE(frame.ok()) << frame.status().ToString();
  return frame.ok() ? *frame : std::string();
}

// Feeds `bytes` and returns the decoder's verdict on the first frame.
Status DecodeStatus(std::string_view bytes, FrameDecoderOptions options = {}) {
  FrameDecoder decoder(std::move(options));
  decoder.Feed(bytes);
  Result<std::optional<Frame>> frame = decoder.Next();
  if (!frame.ok()) return frame.status();
  return frame->has_value() ? OkStatus() : decoder.Finish();
}

TEST(FrameTest, HeaderLayoutIsLittleEndian) {
  const std::string frame = MustEncode(0x0102, "abc", 2);
  ASSERT_EQ(frame.size(), kFrameHeaderSize + 3);
  EXPECT_EQ(frame.substr(0, 4), "BATN");
  EXPECT_EQ(frame.substr(4, 2), std::string("\x01\x00", 2));  // version 1
  EXPECT_EQ(frame.substr(6, 2), std::string("\x02\x01", 2));  // type 0x0102
  EXPECT_EQ(frame.substr(8, 4), std::string("\x03\x00\x00\x00", 4));
  EXPECT_EQ(frame.substr(12, 2), std::string("\x02\x00", 2));
  EXPECT_EQ(frame.substr(14, 2), std::string("\x00\x00", 2));
  const FrameHeader h = ReadFrameHeader(reinterpret_cast<const uint8_t*>(frame.data()));
  EXPECT_EQ(h.payload_crc32c, Crc32c("abc"));
  EXPECT_EQ(frame.substr(20), "abc");
}

TEST(FrameTest, RoundTrip) {
  FrameDecoder decoder;
  decoder.Feed(MustEncode(7, "payload bytes", 3));
  Result<std::optional<Frame>> frame = decoder.Next();
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  ASSERT_TRUE(frame->has_value());
  EXPECT_EQ((*frame)->type, 7);
  EXPECT_EQ((*frame)->fd_count, 3);
  EXPECT_EQ((*frame)->payload, "payload bytes");
  EXPECT_EQ(decoder.buffered(), 0u);
  EXPECT_EQ(decoder.consumed(), kFrameHeaderSize + 13);
  EXPECT_TRUE(decoder.Finish().ok());
}

TEST(FrameTest, EmptyPayload) {
  FrameDecoder decoder;
  decoder.Feed(MustEncode(9, ""));
  Result<std::optional<Frame>> frame = decoder.Next();
  ASSERT_TRUE(frame.ok() && frame->has_value());
  EXPECT_TRUE((*frame)->payload.empty());
}

TEST(FrameTest, ByteByByteAcrossSeveralFrames) {
  std::string stream;
  for (int i = 0; i < 5; ++i)
    stream += MustEncode(static_cast<uint16_t>(i + 1), std::string(i * 37, 'a' + i));
  FrameDecoder decoder;
  int seen = 0;
  for (char c : stream) {
    decoder.Feed(std::string_view(&c, 1));
    Result<std::optional<Frame>> frame = decoder.Next();
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    if (!frame->has_value()) continue;
    EXPECT_EQ((*frame)->type, seen + 1);
    EXPECT_EQ((*frame)->payload, std::string(seen * 37, 'a' + seen));
    ++seen;
    EXPECT_TRUE(!decoder.Next().ok() || !decoder.Next()->has_value());
  }
  EXPECT_EQ(seen, 5);
  EXPECT_EQ(decoder.consumed(), stream.size());
  EXPECT_TRUE(decoder.Finish().ok());
}

TEST(FrameTest, ManyFramesInOneFeed) {
  std::string stream;
  for (int i = 0; i < 1000; ++i) stream += MustEncode(1, std::to_string(i));
  FrameDecoder decoder;
  decoder.Feed(stream);
  for (int i = 0; i < 1000; ++i) {
    Result<std::optional<Frame>> frame = decoder.Next();
    ASSERT_TRUE(frame.ok() && frame->has_value());
    EXPECT_EQ((*frame)->payload, std::to_string(i));
  }
  Result<std::optional<Frame>> none = decoder.Next();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(FrameTest, RefusesBadMagic) {
  std::string frame = MustEncode(1, "x");
  frame.replace(0, 4, "GET ");
  const Status s = DecodeStatus(frame);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad frame magic"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("GET "), std::string::npos) << s.message();
}

TEST(FrameTest, RefusesUnsupportedVersion) {
  FrameHeader h = HeaderFor(1, "x");
  h.version = 2;
  const Status s = DecodeStatus(RawFrame(h, "x"));
  EXPECT_NE(s.message().find("unsupported frame version 2"), std::string::npos) << s.message();
}

TEST(FrameTest, RefusesNonzeroReserved) {
  FrameHeader h = HeaderFor(1, "x");
  h.reserved = 5;
  const Status s = DecodeStatus(RawFrame(h, "x"));
  EXPECT_NE(s.message().find("reserved"), std::string::npos) << s.message();
}

TEST(FrameTest, RefusesBadCrc) {
  std::string frame = MustEncode(1, "some payload");
  frame.back() ^= 0x40;
  const Status s = DecodeStatus(frame);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("CRC32C mismatch"), std::string::npos) << s.message();
}

TEST(FrameTest, RefusesOversizedFromHeaderAlone) {
  FrameHeader h;
  h.type = 1;
  h.payload_length = (1u << 20) + 1;
  std::string header(kFrameHeaderSize, '\0');
  WriteFrameHeader(h, reinterpret_cast<uint8_t*>(header.data()));
  FrameDecoder decoder;
  decoder.Feed(header);  // no payload at all: refused before any is buffered
  Result<std::optional<Frame>> frame = decoder.Next();
  ASSERT_FALSE(frame.ok());
  EXPECT_EQ(frame.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(frame.status().message().find("1048577 bytes exceeds the limit of 1048576"),
            std::string::npos)
      << frame.status().message();
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameTest, MaxFrameSizeIsConfigurable) {
  const std::string payload(100, 'p');
  FrameDecoderOptions small;
  small.max_frame_size = 99;
  EXPECT_EQ(DecodeStatus(MustEncode(1, payload), small).code(), StatusCode::kResourceExhausted);
  FrameDecoderOptions exact;
  exact.max_frame_size = 100;
  EXPECT_TRUE(DecodeStatus(MustEncode(1, payload), exact).ok());
  // A frame of exactly the default limit passes; one byte more does not.
  EXPECT_TRUE(DecodeStatus(MustEncode(1, std::string(kDefaultMaxFrameSize, 'z'))).ok());
  EXPECT_FALSE(EncodeFrame(1, std::string(kDefaultMaxFrameSize + 1, 'z')).ok());
}

TEST(FrameTest, RefusesTooManyFds) {
  FrameHeader h = HeaderFor(1, "x", kMaxFdsPerFrame + 1);
  const Status s = DecodeStatus(RawFrame(h, "x"));
  EXPECT_NE(s.message().find("declares 17 fds"), std::string::npos) << s.message();
  EXPECT_FALSE(EncodeFrame(1, "x", kMaxFdsPerFrame + 1).ok());
  EXPECT_TRUE(EncodeFrame(1, "x", kMaxFdsPerFrame).ok());
}

TEST(FrameTest, RefusesUnknownTypeWhenARegistryIsGiven) {
  FrameDecoderOptions options;
  options.is_known_type = [](uint16_t type) { return type == 1; };
  EXPECT_TRUE(DecodeStatus(MustEncode(1, "x"), options).ok());
  const Status s = DecodeStatus(MustEncode(999, "x"), options);
  EXPECT_NE(s.message().find("unknown message type 999"), std::string::npos) << s.message();
}

TEST(FrameTest, TruncatedStreamIsReportedByFinish) {
  const std::string frame = MustEncode(3, "0123456789");
  FrameDecoder in_header;
  in_header.Feed(frame.substr(0, 7));
  ASSERT_TRUE(in_header.Next().ok());
  EXPECT_NE(in_header.Finish().message().find("inside a frame header (7 of 20"), std::string::npos)
      << in_header.Finish().message();
  FrameDecoder in_payload;
  in_payload.Feed(frame.substr(0, 25));
  ASSERT_TRUE(in_payload.Next().ok());
  EXPECT_NE(in_payload.Finish().message().find("type 3 (25 of 30 bytes)"), std::string::npos)
      << in_payload.Finish().message();
}

TEST(FrameTest, FailureIsSticky) {
  std::string bad = MustEncode(1, "x");
  bad[0] = 'X';
  FrameDecoder decoder;
  decoder.Feed(bad);
  ASSERT_FALSE(decoder.Next().ok());
  decoder.Feed(MustEncode(1, "good"));
  EXPECT_FALSE(decoder.Next().ok());
  EXPECT_TRUE(decoder.failed());
  EXPECT_EQ(decoder.buffered(), 0u);
}

}  // namespace
}  // namespace baton::proto
