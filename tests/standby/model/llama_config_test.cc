#include "standby/model/llama_config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "standby/mkmodel/model_presets.h"
#include "standby/model/byte_tokenizer.h"

namespace baton {
namespace {

nlohmann::json TinyJson() { return nlohmann::json::parse(ConfigJson(PresetSpec("tiny"))); }

Status ParseWith(const char* key, nlohmann::json value) {
  nlohmann::json j = TinyJson();
  if (value.is_discarded()) {
    j.erase(key);
  } else {
    j[key] = value;
  }
  return ParseLlamaConfig(j.dump()).status();
}

TEST(LlamaConfigTest, ParsesWrittenConfig) {
  Result<LlamaConfig> c = ParseLlamaConfig(ConfigJson(PresetSpec("tiny")));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->group_size(), 2);
  EXPECT_EQ(c->vocab_size, 260);
  EXPECT_EQ(c->bos_token_id, 256);
  EXPECT_TRUE(c->IsEos(257));
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST(LlamaConfigTest, DefaultsAndLists) {
  nlohmann::json j = TinyJson();
  j.erase("num_key_value_heads");
  j.erase("head_dim");
  j["eos_token_id"] = {257, 258};
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  Result<LlamaConfig> c = ParseLlamaConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_TRUE(c->IsEos(258));
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
}

TEST(LlamaConfigTest, RefusesWithNamedField) {
  auto expect = [](Status s, const std::string& text) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
  };
  expect(ParseWith("hidden_size", nlohmann::json::value_t::discarded),
         "missing required field 'hidden_size'");
  expect(ParseWith("num_key_value_heads", 3), "not a multiple of num_key_value_heads 3");
  expect(ParseWith("vocab_size", "big"), "'vocab_size' must be an integer");
  expect(ParseWith("num_hidden_layers", 0), "num_hidden_layers = 0");
  expect(ParseWith("head_dim", 15), "must be even");
  expect(ParseWith("eos_token_id", 9999), "eos_token_id 9999");
  expect(ParseWith("model_type", "qwen2"), "model_type");
  expect(ParseWith("hidden_act", "gelu"), "hidden_act");
  expect(ParseWith("attention_bias", true), "attention_bias");
  expect(ParseWith("rms_norm_eps", -1.0), "rms_norm_eps");
  expect(ParseWith("rope_scaling", {{"type", "yarn"}, {"factor", 2.0}}), "yarn");
  expect(ParseWith("hidden_size", 1ll << 40), "out of range");
  expect(ParseLlamaConfig("{not json", "cfg.json").status(), "cfg.json: not valid JSON");
  expect(ParseLlamaConfig("[1]").status(), "not a JSON object");
  expect(LoadLlamaConfig("/nonexistent/dir").status(), "cannot open");
}

// A config.json that is a FIFO, a device or huge is refused at once, not waited on or read.
TEST(LlamaConfigTest, AConfigThatIsNoSmallRegularFileIsRefused) {
  const std::string dir = ::testing::TempDir() + "baton-config-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/config.json";
  ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
  Result<LlamaConfig> fifo = LoadLlamaConfig(dir);
  EXPECT_NE(fifo.status().message().find("not a regular file"), std::string::npos)
      << fifo.status().ToString();
  std::filesystem::remove(file);
  std::filesystem::create_symlink("/dev/zero", file);
  EXPECT_NE(LoadLlamaConfig(dir).status().message().find("not a regular file"), std::string::npos);
  std::filesystem::remove(file);
  { std::ofstream(file) << " "; }
  std::filesystem::resize_file(file, 17u << 20);  // sparse
  EXPECT_NE(LoadLlamaConfig(file).status().message().find("over the limit"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(ByteTokenizerTest, RoundTripsBytesAndSkipsSpecials) {
  Result<LlamaConfig> c = ParseLlamaConfig(ConfigJson(PresetSpec("tiny")));
  ASSERT_TRUE(c.ok());
  Result<ByteTokenizer> t = ByteTokenizer::Create(*c);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::string text = "h\xc3\xa9llo\n\x01\xff";
  std::vector<int32_t> ids = t->Encode(text, true);
  ASSERT_EQ(ids.size(), text.size() + 1);
  EXPECT_EQ(ids[0], 256);
  EXPECT_EQ(ids[2], 0xc3);
  EXPECT_EQ(ids.back(), 255);
  ids.push_back(257);
  EXPECT_EQ(t->Decode(ids), text);
  EXPECT_EQ(t->DecodeToken(257), "");
  EXPECT_EQ(t->DecodeToken('A'), "A");
  EXPECT_EQ(t->Encode("ab", false), (std::vector<int32_t>{'a', 'b'}));
}

TEST(ByteTokenizerTest, RefusesVocabulariesThatAreNotBytes) {
  Result<LlamaConfig> c = ParseLlamaConfig(ConfigJson(PresetSpec("tiny")));
  ASSERT_TRUE(c.ok());
  LlamaConfig small = *c;
  small.vocab_size = 200;
  EXPECT_FALSE(ByteTokenizer::Create(small).ok());
  LlamaConfig clash = *c;
  clash.eos_token_ids = {10};
  Status s = ByteTokenizer::Create(clash).status();
  EXPECT_NE(s.message().find("eos_token_id 10"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace baton
