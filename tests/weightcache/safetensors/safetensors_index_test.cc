#include "weightcache/safetensors/safetensors_index.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "tests/weightcache/safetensors_testutil.h"

namespace baton {
namespace {

using testutil::MalformedSafetensorsCases;
using testutil::RawSafetensors;
using testutil::TempDir;
using testutil::TestTensor;
using testutil::ValidSafetensors;

Result<SafetensorsIndex> ParseBytes(std::string_view name, const std::string& bytes) {
  return SafetensorsIndex::ParseBuffer(name, reinterpret_cast<const uint8_t*>(bytes.data()),
                                       bytes.size());
}

// Parses `bytes` from a file and from memory; both must agree on the outcome.
std::vector<Result<SafetensorsIndex>> ParseBothWays(const TempDir& dir, const std::string& name,
                                                    const std::string& bytes) {
  std::vector<Result<SafetensorsIndex>> out;
  out.push_back(SafetensorsIndex::ParseFile(dir.Write(name, bytes)));
  out.push_back(ParseBytes(name, bytes));
  return out;
}

TEST(SafetensorsIndexTest, EveryDtypeRoundTrips) {
  const std::vector<TestTensor> specs = {
      {"f64", "F64", {3}},      {"f32", "F32", {2, 3}},   {"f16", "F16", {5}},
      {"bf16", "BF16", {4, 1}}, {"i64", "I64", {1}},      {"i32", "I32", {2, 2}},
      {"i16", "I16", {3}},      {"i8", "I8", {7}},        {"u8", "U8", {2, 2, 2}},
      {"bool", "BOOL", {9}},    {"e4m3", "F8_E4M3", {6}}, {"e5m2", "F8_E5M2", {1, 3}},
  };
  TempDir dir;
  const std::string bytes = ValidSafetensors(specs);
  for (auto& r : ParseBothWays(dir, "all.safetensors", bytes)) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const SafetensorsIndex& index = *r;
    ASSERT_EQ(index.tensors().size(), specs.size());
    EXPECT_EQ(index.file_size(), bytes.size());
    EXPECT_EQ(index.data_offset(), 8 + index.header_size());
    uint64_t offset = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const TensorInfo& t = index.tensors()[i];
      EXPECT_EQ(t.name, specs[i].name);
      EXPECT_EQ(DTypeName(t.dtype), specs[i].dtype);
      EXPECT_EQ(t.shape, specs[i].shape);
      EXPECT_EQ(t.begin, offset);
      EXPECT_EQ(t.size(), t.element_count() * DTypeSize(t.dtype));
      offset = t.end;
      EXPECT_EQ(index.Find(t.name), &t);
    }
    EXPECT_EQ(offset, index.data_size());
    EXPECT_EQ(index.Find("absent"), nullptr);
    EXPECT_TRUE(index.metadata().empty());
  }
}

TEST(SafetensorsIndexTest, TensorsAreSortedByOffsetNotName) {
  TempDir dir;
  const std::string bytes = ValidSafetensors({{"z", "F32", {2}}, {"a", "U8", {3}}});
  for (auto& r : ParseBothWays(dir, "order.safetensors", bytes)) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->tensors().size(), 2u);
    EXPECT_EQ(r->tensors()[0].name, "z");
    EXPECT_EQ(r->tensors()[1].name, "a");
    EXPECT_EQ(r->tensors()[1].begin, 8u);
    EXPECT_EQ(r->tensors()[1].end, 11u);
  }
}

TEST(SafetensorsIndexTest, ZeroSizeAndScalarTensorsAreLegal) {
  TempDir dir;
  const std::string bytes =
      ValidSafetensors({{"empty", "F32", {0, 4}}, {"scalar", "F64", {}}, {"tail", "BF16", {0}}});
  for (auto& r : ParseBothWays(dir, "zero.safetensors", bytes)) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const TensorInfo* empty = r->Find("empty");
    ASSERT_NE(empty, nullptr);
    EXPECT_EQ(empty->size(), 0u);
    EXPECT_EQ(empty->element_count(), 0u);
    const TensorInfo* scalar = r->Find("scalar");
    ASSERT_NE(scalar, nullptr);
    EXPECT_TRUE(scalar->shape.empty());
    EXPECT_EQ(scalar->element_count(), 1u);
    EXPECT_EQ(scalar->size(), 8u);
    const TensorInfo* tail = r->Find("tail");
    ASSERT_NE(tail, nullptr);
    EXPECT_EQ(tail->begin, 8u);
    EXPECT_EQ(tail->end, 8u);
    EXPECT_EQ(r->data_size(), 8u);
  }
}

TEST(SafetensorsIndexTest, MetadataIsKept) {
  TempDir dir;
  const std::string bytes =
      ValidSafetensors({{"w", "F16", {2}}}, {{"format", "pt"}, {"producer", "baton"}});
  for (auto& r : ParseBothWays(dir, "meta.safetensors", bytes)) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->tensors().size(), 1u);
    ASSERT_EQ(r->metadata().size(), 2u);
    EXPECT_EQ(r->metadata().at("format"), "pt");
    EXPECT_EQ(r->metadata().at("producer"), "baton");
  }
}

TEST(SafetensorsIndexTest, SpacePaddedHeaderIsLegal) {
  TempDir dir;
  const std::string bytes = ValidSafetensors({{"w", "I32", {3}}}, {}, 7);
  for (auto& r : ParseBothWays(dir, "padded.safetensors", bytes)) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->data_offset() + r->data_size(), bytes.size());
    EXPECT_EQ(r->data_size(), 12u);
    EXPECT_EQ(bytes[r->data_offset() - 1], ' ');
  }
}

TEST(SafetensorsIndexTest, EmptyTensorSetWithNoDataIsLegal) {
  TempDir dir;
  for (const char* header : {"{}", R"({"__metadata__":{}})"}) {
    for (auto& r : ParseBothWays(dir, "empty.safetensors", RawSafetensors(header, 0))) {
      ASSERT_TRUE(r.ok()) << header << ": " << r.status().ToString();
      EXPECT_TRUE(r->tensors().empty());
      EXPECT_EQ(r->data_size(), 0u);
    }
  }
}

TEST(SafetensorsIndexTest, NegativeZeroIsZero) {
  auto r =
      ParseBytes("neg0.safetensors",
                 RawSafetensors(R"({"w":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}})", 0));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors()[0].shape, std::vector<int64_t>{0});
}

TEST(SafetensorsIndexTest, EachMalformedFileIsRefusedNamingFileTensorAndRule) {
  TempDir dir;
  const auto cases = MalformedSafetensorsCases();
  ASSERT_GE(cases.size(), 14u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    for (auto& r : ParseBothWays(dir, c.file, c.bytes)) {
      ASSERT_FALSE(r.ok());
      const Status& s = r.status();
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_NE(s.message().find(c.file), std::string::npos) << s.message();
      EXPECT_NE(s.message().find("(rule: " + c.rule + ")"), std::string::npos) << s.message();
      if (!c.tensor.empty()) {
        EXPECT_NE(s.message().find("tensor '" + c.tensor + "'"), std::string::npos) << s.message();
      } else {
        EXPECT_EQ(s.message().find("tensor '"), std::string::npos) << s.message();
      }
    }
  }
}

TEST(SafetensorsIndexTest, MalformedCasesCoverEveryRule) {
  std::set<std::string> rules;
  for (const auto& c : MalformedSafetensorsCases()) rules.insert(c.rule);
  for (const char* rule : {"header-length-field",
                           "header-length-limit",
                           "header-inside-file",
                           "header-begins-with-brace",
                           "header-padding",
                           "header-json",
                           "header-nesting",
                           "duplicate-key",
                           "entry-object",
                           "entry-fields",
                           "dtype-known",
                           "shape-integers",
                           "offsets-pair",
                           "size-overflow",
                           "byte-range-matches-shape",
                           "data-inside-file",
                           "ranges-contiguous",
                           "ranges-no-overlap",
                           "data-ends-at-file-end",
                           "metadata-strings"}) {
    EXPECT_TRUE(rules.count(rule)) << rule;
  }
}

TEST(SafetensorsIndexTest, MessagesSpellOutTheNumbers) {
  auto r = ParseBytes(
      "m.safetensors",
      RawSafetensors(R"({"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,10]}})", 10));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "m.safetensors: tensor 'a.weight': data_offsets [0, 10) hold 10 bytes but 6 "
            "elements of F32 need 24 (rule: byte-range-matches-shape)");
}

TEST(SafetensorsIndexTest, UnprintableTensorNamesAreEscaped) {
  auto r =
      ParseBytes("e.safetensors",
                 RawSafetensors(R"({"a\nb":{"dtype":"X","shape":[],"data_offsets":[0,0]}})", 0));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor 'a\\x0ab'"), std::string::npos)
      << r.status().message();
}

TEST(SafetensorsIndexTest, ParseHeaderChecksTheFileSize) {
  auto r = SafetensorsIndex::ParseHeader("h", "{}", 9);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rule: header-inside-file"), std::string::npos);
  auto ok = SafetensorsIndex::ParseHeader("h", "{}", 10);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->header_size(), 2u);
}

TEST(SafetensorsIndexTest, OpenFailuresNameThePathAndErrno) {
  TempDir dir;
  auto missing = SafetensorsIndex::ParseFile(dir.path() + "/nope.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_NE(missing.status().message().find("nope.safetensors"), std::string::npos);
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos);

  auto directory = SafetensorsIndex::ParseFile(dir.path());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos);
}

}  // namespace
}  // namespace baton
