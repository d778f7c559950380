// baton-weights, run as a process: its commands, their JSON and their exit status.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "tests/weightcache/io/pinned_arena_testutil.h"
#include "tests/weightcache/sharded_model_testutil.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using arena_testing::HugePagesFree;
using cachetest::MakeTensor;
using cachetest::TempDir;
using cachetest::TestTensor;
using cachetest::WriteSafetensors;
using cachetest::WriteShardedModel;

struct ToolRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs build/bin/`tool` (baton-weights by default) with `args`; stdout and stderr are
// captured.
ToolRun RunTool(const std::string& args, const std::string& tool = "baton-weights") {
  const std::string err_path =
      ::testing::TempDir() + "baton-weights-stderr-" + std::to_string(::getpid());
  const std::string cmd = std::string(BATON_BIN_DIR) + "/" + tool + " " + args + " 2>" + err_path;
  ToolRun run;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) run.out.append(buf, n);
  const int status = ::pclose(p);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  run.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  fs::remove(err_path);
  return run;
}

nlohmann::json LastLineJson(const std::string& out) {
  std::string text = out;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return nlohmann::json::parse(text.substr(text.rfind('\n') + 1));
}

class WeightsToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(BATON_BIN_DIR) + "/baton-weights")) {
      GTEST_SKIP() << "baton-weights is not built";
    }
    tensors_ = WriteShardedModel(dir_.path());
  }
  TempDir dir_;
  std::vector<TestTensor> tensors_;
};

TEST_F(WeightsToolTest, LoadPrintsWhatTheCacheHolds) {
  ToolRun run = RunTool("load " + dir_.path() + " --json --queue-depth 8 --chunk-mib 1");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  nlohmann::json j = LastLineJson(run.out);
  EXPECT_EQ(j["tensors"], tensors_.size());
  EXPECT_GT(j["arena_bytes"].get<uint64_t>(), j["tensor_bytes"].get<uint64_t>());
  EXPECT_TRUE(j["load_s"].is_number());
  EXPECT_TRUE(j["load_gbps"].is_number());
  EXPECT_TRUE(j["huge_pages"].is_boolean());
  EXPECT_EQ(j["numa_node"], 0);
  EXPECT_TRUE(j["warnings"].is_array());

  ToolRun plain = RunTool("load " + dir_.path() + " --no-uring --no-direct --numa 0");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("pread"), std::string::npos) << plain.out;
}

TEST_F(WeightsToolTest, InspectShowsTheHeaderAndRefusesMalformedFiles) {
  ToolRun run = RunTool("inspect " + dir_.path() + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  nlohmann::json j = LastLineJson(run.out);
  EXPECT_EQ(j["files"].size(), 3u);
  EXPECT_EQ(j["tensors"], tensors_.size());
  EXPECT_EQ(j["files"][0]["tensors"][0]["name"], "embed.weight");
  EXPECT_EQ(j["files"][0]["tensors"][0]["dtype"], "BF16");

  const std::string bad = dir_.path() + "/bad.bin";
  std::ofstream(bad, std::ios::binary) << std::string("\x05\0\0\0\0\0\0\0{\"a\"", 12);
  ToolRun refused = RunTool("inspect " + bad);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("bad.bin"), std::string::npos) << refused.err;
  // With --json, a failure is a JSON object on stdout's last line too; bad usage exits 2.
  ToolRun json = RunTool("inspect " + bad + " --json");
  EXPECT_EQ(json.exit_code, 1);
  const nlohmann::json error = LastLineJson(json.out);
  EXPECT_EQ(error["ok"], false) << json.out;
  EXPECT_NE(error["error"].get<std::string>().find("bad.bin"), std::string::npos) << json.out;
  ToolRun usage = RunTool("load " + dir_.path() + " --queue-depth 0 --json");
  EXPECT_EQ(usage.exit_code, 2) << usage.err;
  EXPECT_EQ(LastLineJson(usage.out)["error"], "--queue-depth must be between 1 and 4096");
}

// baton-mkmodel says its errors in JSON with --json too, and takes no flag for a value.
TEST(MkmodelToolTest, ErrorsAreJsonWithJsonAndAFlagIsNoValue) {
  ToolRun run = RunTool("--out --json", "baton-mkmodel");
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_EQ(LastLineJson(run.out)["error"], "--out needs a value") << run.out;
  EXPECT_FALSE(fs::exists("--json"));
  run = RunTool("--out /proc/baton-nowhere --json", "baton-mkmodel");
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_EQ(LastLineJson(run.out)["ok"], false) << run.out;
}

TEST_F(WeightsToolTest, AdoptTimesTheTakeOverAndChecksTheBytes) {
  ToolRun run = RunTool("adopt " + dir_.path() + " --json --no-huge-pages");
  ASSERT_EQ(run.exit_code, 0) << run.err << run.out;
  nlohmann::json j = LastLineJson(run.out);
  EXPECT_EQ(j["tensors"], tensors_.size());
  EXPECT_EQ(j["adopt_read_bytes"], 0);
  EXPECT_EQ(j["verified"], true);
  EXPECT_TRUE(j["adopt_ms"].is_number());
  EXPECT_GE(j["adopt_locked_ms"].get<double>(), j["adopt_ms"].get<double>());
  EXPECT_GT(j["manifest_bytes"].get<uint64_t>(), 0u);
  ToolRun plain = RunTool("adopt " + dir_.path() + " --no-lock");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("not locked"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("ok: 7 tensors"), std::string::npos) << plain.out;
}

// An arena allowed fewer huge pages than it needs says how much of it is on each page size,
// and an adopted partial arena reads back the same bytes across the split.
TEST_F(WeightsToolTest, APartialArenaReportsItsSplitAndAdoptsWhole) {
  TempDir big;
  WriteSafetensors(big.path() + "/model.safetensors",
                   {MakeTensor("big", "U8", {5 << 20}, 1, 9), MakeTensor("tail", "F32", {9}, 4, 8)},
                   "");
  ToolRun none = RunTool("load " + big.path() + " --json --no-lock --max-huge-pages 0");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  nlohmann::json n = LastLineJson(none.out);
  EXPECT_EQ(n["arena_huge_bytes"], 0);
  EXPECT_EQ(n["arena_small_bytes"], n["arena_bytes"]);
  if (HugePagesFree() < 2) {
    GTEST_SKIP() << "a partial arena needs free 2 MiB huge pages (HugePages_Free is "
                 << HugePagesFree() << ")";
  }
  ToolRun run = RunTool("load " + big.path() + " --json --no-lock --max-huge-pages 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  nlohmann::json j = LastLineJson(run.out);
  EXPECT_EQ(j["arena_huge_bytes"], 4u << 20) << j.dump();
  EXPECT_EQ(j["arena_small_bytes"].get<uint64_t>(), j["arena_bytes"].get<uint64_t>() - (4u << 20));
  EXPECT_NE(j["warnings"].dump().find("partial huge pages"), std::string::npos) << j.dump();
  ToolRun text = RunTool("load " + big.path() + " --no-lock --max-huge-pages 2");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("(4194304 on 2 MiB pages, "), std::string::npos) << text.out;
  ToolRun adopt = RunTool("adopt " + big.path() + " --json --no-lock --max-huge-pages 2");
  ASSERT_EQ(adopt.exit_code, 0) << adopt.err << adopt.out;
  nlohmann::json a = LastLineJson(adopt.out);
  EXPECT_EQ(a["verified"], true) << a.dump();
  EXPECT_EQ(a["arena_huge_bytes"], 4u << 20) << a.dump();
}

TEST_F(WeightsToolTest, BadUsageExitsTwo) {
  EXPECT_EQ(RunTool("").exit_code, 2);
  EXPECT_EQ(RunTool("frobnicate x").exit_code, 2);
  EXPECT_EQ(RunTool("load").exit_code, 2);
  EXPECT_EQ(RunTool("adopt").exit_code, 2);
  EXPECT_EQ(RunTool("load " + dir_.path() + " --queue-depth").exit_code, 2);
  EXPECT_EQ(RunTool("load " + dir_.path() + " --chunk-mib 0").exit_code, 2);
  EXPECT_EQ(RunTool("load " + dir_.path() + " --max-huge-pages -1").exit_code, 2);
  EXPECT_EQ(RunTool("inspect " + dir_.path() + " --no-direct").exit_code, 2);
  EXPECT_EQ(RunTool("load " + dir_.path() + "/absent").exit_code, 1);
}

TEST_F(WeightsToolTest, HashThenVerifyCatchesAFlippedByte) {
  EXPECT_EQ(RunTool("verify " + dir_.path()).exit_code, 1);  // no manifest yet
  ToolRun hash = RunTool("hash " + dir_.path());
  ASSERT_EQ(hash.exit_code, 0) << hash.err;
  EXPECT_TRUE(fs::exists(dir_.path() + "/baton-integrity.json"));
  ToolRun ok = RunTool("verify " + dir_.path() + " --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err << ok.out;
  EXPECT_EQ(LastLineJson(ok.out)["checked"], tensors_.size());

  const std::string shard = dir_.path() + "/model-00002-of-00003.safetensors";
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-10, std::ios::end);  // inside layers.0.scale, the shard's last tensor
  f.put('\x7f');
  f.close();
  ToolRun bad = RunTool("verify " + dir_.path());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find("layers.0.scale"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace baton
