#include "standby/mkmodel/model_presets.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "standby/model/llama_config.h"

namespace baton {
namespace {

TEST(ModelPresetsTest, TinyIsSmallAndLlamaShaped) {
  const ModelSpec spec = PresetSpec("tiny");
  EXPECT_EQ(spec.preset, "tiny");
  EXPECT_EQ(spec.hidden_size, 64);
  EXPECT_EQ(spec.num_hidden_layers, 2);
  EXPECT_EQ(spec.num_attention_heads, 4);
  EXPECT_EQ(spec.num_key_value_heads, 2);
  EXPECT_EQ(spec.vocab_size, kSyntheticVocabSize);
  EXPECT_EQ(spec.dtype, DType::kF32);
  EXPECT_TRUE(ValidateSpec(spec).ok());
  EXPECT_LT(spec.tensor_bytes(), 8u << 20);
  // Tiny keeps its layer count in every dtype.
  EXPECT_EQ(PresetSpec("tiny", DType::kBF16).num_hidden_layers, 2);
}

TEST(ModelPresetsTest, SizedPresetsHitTheirTargetInEveryDType) {
  const struct {
    const char* name;
    double target;
  } cases[] = {{"small", 256.0 * (1 << 20)}, {"1g", 1.0 * (1 << 30)}, {"4g", 4.0 * (1 << 30)}};
  for (const auto& c : cases) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      const ModelSpec spec = PresetSpec(c.name, dtype);
      ASSERT_TRUE(ValidateSpec(spec).ok()) << c.name;
      const double bytes = static_cast<double>(spec.tensor_bytes());
      EXPECT_NEAR(bytes / c.target, 1.0, 0.15) << c.name << " " << TorchDTypeName(dtype);
    }
  }
  EXPECT_NEAR(PresetSpec("4g", DType::kF16).num_hidden_layers,
              2 * PresetSpec("4g", DType::kF32).num_hidden_layers, 1);
}

TEST(ModelPresetsTest, UnknownPresetIsRefusedWithTheKnownNames) {
  EXPECT_FALSE(ValidateSpec(PresetSpec("huge")).ok());
  const Result<ModelSpec> spec = ParsePreset("huge");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("huge"), std::string::npos);
  EXPECT_NE(spec.status().message().find("tiny, small, 1g, 4g"), std::string::npos);
}

TEST(ModelPresetsTest, ValidateNamesTheBadField) {
  ModelSpec spec = PresetSpec("tiny");
  spec.num_attention_heads = 3;
  EXPECT_NE(ValidateSpec(spec).message().find("num_attention_heads"), std::string::npos);
  spec = PresetSpec("tiny");
  spec.num_key_value_heads = 3;
  EXPECT_NE(ValidateSpec(spec).message().find("num_key_value_heads"), std::string::npos);
  spec = PresetSpec("tiny");
  spec.shards = 3 + 9 * 2 + 1;  // one more than there are tensors
  EXPECT_NE(ValidateSpec(spec).message().find("shards"), std::string::npos);
  spec.shards = 0;
  EXPECT_FALSE(ValidateSpec(spec).ok());
  spec = PresetSpec("tiny");
  spec.dtype = DType::kI8;
  EXPECT_NE(ValidateSpec(spec).message().find("dtype"), std::string::npos);
  spec = PresetSpec("tiny");
  spec.vocab_size = 100;
  EXPECT_NE(ValidateSpec(spec).message().find("vocab_size"), std::string::npos);
}

TEST(ModelPresetsTest, ParsesDTypes) {
  EXPECT_EQ(*ParseModelDType("f32"), DType::kF32);
  EXPECT_EQ(*ParseModelDType("f16"), DType::kF16);
  EXPECT_EQ(*ParseModelDType("bf16"), DType::kBF16);
  EXPECT_EQ(*ParseModelDType("BF16"), DType::kBF16);
  EXPECT_FALSE(ParseModelDType("int8").ok());
  EXPECT_EQ(ModelDTypeSize(DType::kF32), 4u);
  EXPECT_EQ(ModelDTypeSize(DType::kBF16), 2u);
}

TEST(ModelPresetsTest, ConfigJsonIsHuggingFaceLlama) {
  ModelSpec spec = PresetSpec("tiny", DType::kBF16);
  spec.seed = 7;
  const nlohmann::json config = nlohmann::json::parse(ConfigJson(spec));
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["hidden_size"], 64);
  EXPECT_EQ(config["intermediate_size"], spec.intermediate_size);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["vocab_size"], kSyntheticVocabSize);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["bos_token_id"], kBosTokenId);
  EXPECT_EQ(config["eos_token_id"], kEosTokenId);
  EXPECT_DOUBLE_EQ(config["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(config["rope_theta"].get<double>(), 10000.0);
  EXPECT_EQ(config["baton"]["seed"], 7);
}

TEST(ModelPresetsTest, SpecFromConfigJsonRecognizesOnlyWrittenConfigs) {
  ModelSpec spec = PresetSpec("small", DType::kF16);
  spec.seed = 1234567890123ull;
  spec.shards = 3;
  const std::string text = ConfigJson(spec);
  const std::optional<ModelSpec> back = SpecFromConfigJson(text);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(ConfigJson(*back), text);
  EXPECT_EQ(back->seed, spec.seed);
  EXPECT_EQ(back->shards, 3);
  EXPECT_EQ(back->dtype, DType::kF16);
  EXPECT_EQ(back->num_hidden_layers, spec.num_hidden_layers);

  nlohmann::json edited = nlohmann::json::parse(text);
  ASSERT_TRUE(SpecFromConfigJson(edited.dump(2) + "\n").has_value());  // re-dumps identically
  edited["num_hidden_layers"] = 1;                                     // no longer the preset's
  EXPECT_FALSE(SpecFromConfigJson(edited.dump(2) + "\n").has_value());
  edited = nlohmann::json::parse(text);
  edited.erase("baton");
  EXPECT_FALSE(SpecFromConfigJson(edited.dump(2) + "\n").has_value());
  edited = nlohmann::json::parse(text);
  edited["baton"]["shards"] = -1;
  EXPECT_FALSE(SpecFromConfigJson(edited.dump(2) + "\n").has_value());
  EXPECT_FALSE(SpecFromConfigJson("").has_value());
  EXPECT_FALSE(SpecFromConfigJson("[1, 2]").has_value());
  EXPECT_FALSE(SpecFromConfigJson("{\"baton\": 5, \"torch_dtype\": 1}").has_value());
}

TEST(ModelPresetsTest, ConfigJsonIsAcceptedByTheEngineConfigParser) {
  for (const std::string& name : PresetNames()) {
    const Result<LlamaConfig> config = ParseLlamaConfig(ConfigJson(PresetSpec(name)));
    ASSERT_TRUE(config.ok()) << name << ": " << config.status().ToString();
    EXPECT_EQ(config->hidden_size, PresetSpec(name).hidden_size);
    EXPECT_EQ(config->vocab_size, kSyntheticVocabSize);
    EXPECT_TRUE(config->IsEos(kEosTokenId));
  }
}

}  // namespace
}  // namespace baton
