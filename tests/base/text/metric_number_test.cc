#include "base/text/metric_number.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace baton {
namespace {

TEST(MetricNumber, IntegersAreWrittenWithEveryDigit) {
  EXPECT_EQ(MetricNumber(0), "0");
  EXPECT_EQ(MetricNumber(-0.0), "0");
  EXPECT_EQ(MetricNumber(1), "1");
  EXPECT_EQ(MetricNumber(-3), "-3");
  EXPECT_EQ(MetricNumber(1e6), "1000000");
  EXPECT_EQ(MetricNumber(2097152), "2097152");
  EXPECT_EQ(MetricNumber(12345678), "12345678");
  EXPECT_EQ(MetricNumber(17179869184.0), "17179869184");            // a 16 GiB arena
  EXPECT_EQ(MetricNumber(9007199254740993.0), "9007199254740992");  // 2^53 + 1, as a double
  EXPECT_EQ(MetricNumber(1e20), "1e+20");                           // past int64_t: still exact
}

TEST(MetricNumber, FractionsReadBackAsTheSameDouble) {
  EXPECT_EQ(MetricNumber(0.1), "0.1");
  EXPECT_EQ(MetricNumber(0.005), "0.005");
  EXPECT_EQ(MetricNumber(11.337612), "11.337612");
  EXPECT_EQ(MetricNumber(1234567.25), "1234567.25");
  for (double v : {1.0 / 3, 2.0 / 3 * 1e7, 1e-9 + 1, 123456.789012345}) {
    EXPECT_EQ(std::strtod(MetricNumber(v).c_str(), nullptr), v) << MetricNumber(v);
  }
}

TEST(MetricNumber, NonFiniteValuesAreSpelledAsPrometheusReadsThem) {
  EXPECT_EQ(MetricNumber(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(MetricNumber(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(MetricNumber(-std::numeric_limits<double>::infinity()), "-Inf");
}

}  // namespace
}  // namespace baton
