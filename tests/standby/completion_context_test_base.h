// CompletionContextTest: a GoogleTest fixture holding what request parsing needs of the tiny
// preset model (its config, byte tokenizer and a CompletionContext serving it as "tiny" with
// the random seed 777), for the completions and chat API tests. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <optional>

#include "standby/mkmodel/model_presets.h"
#include "standby/openai/completions_api.h"

namespace baton {

class CompletionContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<LlamaConfig> config = ParseLlamaConfig(ConfigJson(PresetSpec("tiny")));
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    Result<ByteTokenizer> tokenizer = ByteTokenizer::Create(config_);
    ASSERT_TRUE(tokenizer.ok());
    tokenizer_.emplace(*tokenizer);
    ctx_ = {&config_, &*tokenizer_, "tiny", 777};
  }

  LlamaConfig config_;
  std::optional<ByteTokenizer> tokenizer_;
  CompletionContext ctx_;
};

}  // namespace baton
