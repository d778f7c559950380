// batonctl status's text (controller/ctl/ctl_status_text.cc) on a status made by hand.
#include <gtest/gtest.h>

#include <string>

#include "controller/ctl/ctl_service.h"

namespace baton {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(StatusText, TheWeightsSayTheirLoadSpeedOrThatTheyWereAdopted) {
  ControllerConfig config;
  ControllerStatus s;
  s.config = &config;
  s.weights.load_gbps = 1.2398105845745673;
  s.weights.bytes_read = 4'194'304;
  EXPECT_TRUE(Has(StatusText(s), ", loaded at 1.24 GB/s\n")) << StatusText(s);
  s.weights.load_gbps = 0;
  s.weights.bytes_read = 0;  // a controller that adopted the arena from baton-keeper
  EXPECT_TRUE(Has(StatusText(s), ", adopted (no byte read)\n")) << StatusText(s);
}

}  // namespace
}  // namespace baton
