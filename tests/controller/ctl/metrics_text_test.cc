// The controller's /metrics text (controller/ctl/metrics_text.cc) on a status made by hand.
#include <gtest/gtest.h>

#include <string>

#include "controller/ctl/ctl_service.h"

namespace baton {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(MetricsText, LargeValuesAreWrittenWithEveryDigit) {
  ControllerConfig config;
  ControllerStatus s;
  s.config = &config;
  s.weights.arena_bytes = 2'097'152;
  s.journal.durable = 1'234'567;
  s.journal.reserved = 1'234'599;
  s.core.ticks = 12'345'678;
  s.core.recovery.readopt_ms = 11.337612;
  const std::string text = MetricsText(s);
  EXPECT_TRUE(Has(text, "\nbaton_weights_bytes 2097152\n")) << text;
  EXPECT_TRUE(Has(text, "\nbaton_epoch 1234567\n")) << text;
  EXPECT_TRUE(Has(text, "\nbaton_epoch_reserved 1234599\n")) << text;
  EXPECT_TRUE(Has(text, "\nbaton_controller_ticks_total 12345678\n")) << text;
  EXPECT_TRUE(Has(text, "\nbaton_controller_readopt_ms 11.337612\n")) << text;
}

}  // namespace
}  // namespace baton
