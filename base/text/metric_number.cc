#include "base/text/metric_number.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

namespace baton {

std::string MetricNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Every double of magnitude 2^53 or more is an integer; those below 2^63 fit an int64_t.
  constexpr double kInt64Bound = 9223372036854775808.0;  // 2^63
  if (value == std::trunc(value) && std::fabs(value) < kInt64Bound) {
    return std::to_string(static_cast<int64_t>(value));
  }
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  if (r.ec != std::errc()) return "NaN";  // cannot happen: 64 bytes hold any double
  return std::string(buf, r.ptr);
}

}  // namespace baton
