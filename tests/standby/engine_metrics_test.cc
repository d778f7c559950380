// The reference engine's /metrics text (standby/engine_metrics.h).
#include "standby/engine_metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace baton {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(EngineMetricsText, LargeCountersAreWrittenWithEveryDigit) {
  EngineMetrics m;
  m.AddPromptTokens(12'345'678'901);
  m.AddGeneratedTokens(2'097'152);
  const std::string text = m.Render();
  EXPECT_TRUE(Has(text, "\nbaton_engine_prompt_tokens_total 12345678901\n")) << text;
  EXPECT_TRUE(Has(text, "\nbaton_engine_generated_tokens_total 2097152\n")) << text;
}

}  // namespace
}  // namespace baton
