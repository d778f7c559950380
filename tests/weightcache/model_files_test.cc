#include "weightcache/model_files.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/weightcache/safetensors_testutil.h"

namespace baton {
namespace {

using testutil::RawSafetensors;
using testutil::TempDir;
using testutil::ValidSafetensors;

constexpr char kIndex[] = "model.safetensors.index.json";

// Two shards: s1 holds a (F32 [2]) and b (U8 [3]); s2 holds c (BF16 [4]).
void WriteTwoShards(const TempDir& dir) {
  dir.Write("s1.safetensors", ValidSafetensors({{"a", "F32", {2}}, {"b", "U8", {3}}}));
  dir.Write("s2.safetensors", ValidSafetensors({{"c", "BF16", {4}}}));
}

std::string Index(const std::string& weight_map) {
  return R"({"metadata":{"total_size":19},"weight_map":)" + weight_map + "}";
}

void ExpectRefused(const Result<ModelFiles>& r, const std::string& rule,
                   const std::vector<std::string>& mentions) {
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("(rule: " + rule + ")"), std::string::npos) << m;
  for (const std::string& s : mentions) EXPECT_NE(m.find(s), std::string::npos) << s << " in " << m;
}

TEST(ModelFilesTest, SingleFile) {
  TempDir dir;
  const std::string bytes = ValidSafetensors({{"w", "F32", {4}}, {"b", "F16", {2}}});
  dir.Write("model.safetensors", bytes);
  auto r = ModelFiles::Open(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->shards().size(), 1u);
  EXPECT_EQ(r->tensor_count(), 2u);
  EXPECT_EQ(r->total_file_bytes(), bytes.size());
  EXPECT_EQ(r->total_tensor_bytes(), 20u);
  const ModelFiles::Location* w = r->Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shard, 0u);
  EXPECT_EQ(w->tensor->size(), 16u);
  EXPECT_EQ(r->Find("nope"), nullptr);
}

TEST(ModelFilesTest, GoodIndex) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write(kIndex, Index(R"({"c":"s2.safetensors","a":"s1.safetensors","b":"s1.safetensors"})"));
  dir.Write("unrelated.safetensors", "not even a safetensors file");
  auto r = ModelFiles::Open(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->shards().size(), 2u);
  EXPECT_EQ(r->shards()[0].path(), dir.path() + "/s1.safetensors");
  EXPECT_EQ(r->shards()[1].path(), dir.path() + "/s2.safetensors");
  EXPECT_EQ(r->tensor_count(), 3u);
  EXPECT_EQ(r->total_tensor_bytes(), 8u + 3u + 8u);
  const ModelFiles::Location* c = r->Find("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->shard, 1u);
  EXPECT_EQ(c->tensor->name, "c");
  EXPECT_EQ(DTypeName(c->tensor->dtype), "BF16");
}

TEST(ModelFilesTest, CopiesKeepLocationsValid) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write(kIndex, Index(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})"));
  auto original = std::make_unique<ModelFiles>(ModelFiles::Open(dir.path()).value());
  ModelFiles copy = *original;
  ModelFiles assigned;
  assigned = *original;
  original.reset();
  for (const ModelFiles* m : {&copy, &assigned}) {
    const ModelFiles::Location* b = m->Find("b");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->tensor, &m->shards()[0].tensors()[1]);
    EXPECT_EQ(b->tensor->name, "b");
  }
  ModelFiles moved = std::move(copy);
  EXPECT_EQ(moved.Find("c")->tensor->name, "c");
}

TEST(ModelFilesTest, WithoutIndexEverySafetensorsFileIsAShard) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write("README.md", "not a shard");
  auto r = ModelFiles::Open(dir.path() + "/");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->shards().size(), 2u);
  EXPECT_EQ(r->Find("a")->shard, 0u);
  EXPECT_EQ(r->Find("c")->shard, 1u);
}

TEST(ModelFilesTest, WithoutIndexATensorInTwoFilesIsRefused) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write("s3.safetensors", ValidSafetensors({{"b", "U8", {3}}}));
  ExpectRefused(ModelFiles::Open(dir.path()), "tensor-in-two-shards",
                {"s3.safetensors", "s1.safetensors", "tensor 'b'"});
}

TEST(ModelFilesTest, EmptyAndMissingDirectories) {
  TempDir dir;
  auto empty = ModelFiles::Open(dir.path());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find(dir.path()), std::string::npos);
  auto missing = ModelFiles::Open(dir.path() + "/absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("absent"), std::string::npos);
}

TEST(ModelFilesTest, IndexNamingAMissingFile) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write(kIndex, Index(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors",)"
                          R"("d":"s3.safetensors"})"));
  ExpectRefused(ModelFiles::Open(dir.path()), "shard-file",
                {kIndex, "tensor 'd'", "s3.safetensors", "No such file"});
}

TEST(ModelFilesTest, TensorInTheWrongShard) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write(kIndex, Index(R"({"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"})"));
  ExpectRefused(ModelFiles::Open(dir.path()), "tensor-in-named-shard",
                {kIndex, "tensor 'b'", "s2.safetensors", "s1.safetensors"});
}

TEST(ModelFilesTest, MappedTensorHeldByNoShard) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write(kIndex, Index(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors",)"
                          R"("ghost":"s2.safetensors"})"));
  ExpectRefused(ModelFiles::Open(dir.path()), "tensor-in-named-shard",
                {kIndex, "tensor 'ghost'", "s2.safetensors"});
}

TEST(ModelFilesTest, TensorInTwoShards) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write("s3.safetensors", ValidSafetensors({{"c", "BF16", {4}}}));
  dir.Write(kIndex, Index(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors",)"
                          R"("x":"s3.safetensors"})"));
  ExpectRefused(ModelFiles::Open(dir.path()), "tensor-in-two-shards",
                {"tensor 'c'", "s2.safetensors", "s3.safetensors"});
}

TEST(ModelFilesTest, UnmappedTensor) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write(kIndex, Index(R"({"a":"s1.safetensors","c":"s2.safetensors"})"));
  ExpectRefused(ModelFiles::Open(dir.path()), "tensor-unmapped",
                {kIndex, "tensor 'b'", "s1.safetensors"});
}

TEST(ModelFilesTest, ShardNamesMustStayInsideTheDirectory) {
  for (const char* name : {"../s1.safetensors", "sub/s1.safetensors", "/etc/passwd", "..", ""}) {
    TempDir dir;
    WriteTwoShards(dir);
    dir.Write(kIndex, Index(std::string(R"({"a":")") + name +
                            R"(","b":"s1.safetensors","c":"s2.safetensors"})"));
    SCOPED_TRACE(name);
    ExpectRefused(ModelFiles::Open(dir.path()), "shard-name", {kIndex, "tensor 'a'"});
  }
}

TEST(ModelFilesTest, MalformedIndexFiles) {
  struct Case {
    std::string text;
    std::string rule;
  };
  const Case cases[] = {
      {"{\"weight_map\": {", "index-json"},
      {"[]", "index-weight-map"},
      {R"({"metadata":{}})", "index-weight-map"},
      {R"({"weight_map":[]})", "index-weight-map"},
      {R"({"weight_map":{"a":1}})", "index-weight-map"},
      {R"({"metadata":5,"weight_map":{}})", "index-weight-map"},
      {R"({"weight_map":{"a":"s1.safetensors","a":"s2.safetensors"}})", "duplicate-key"},
      {R"({"weight_map":{},"weight_map":{}})", "duplicate-key"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    TempDir dir;
    WriteTwoShards(dir);
    dir.Write(kIndex, c.text);
    ExpectRefused(ModelFiles::Open(dir.path()), c.rule, {kIndex});
  }
}

TEST(ModelFilesTest, MalformedShardIsRefusedWithItsOwnRule) {
  TempDir dir;
  WriteTwoShards(dir);
  dir.Write("s2.safetensors",
            RawSafetensors(R"({"c":{"dtype":"F7","shape":[4],"data_offsets":[0,8]}})", 8));
  dir.Write(kIndex, Index(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})"));
  ExpectRefused(ModelFiles::Open(dir.path()), "dtype-known", {"s2.safetensors", "tensor 'c'"});
}

TEST(ModelFilesTest, SingleFileWinsOverAnIndex) {
  TempDir dir;
  dir.Write("model.safetensors", ValidSafetensors({{"only", "I8", {1}}}));
  dir.Write(kIndex, Index(R"({"a":"s1.safetensors"})"));
  auto r = ModelFiles::Open(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensor_count(), 1u);
  EXPECT_NE(r->Find("only"), nullptr);
}

}  // namespace
}  // namespace baton
