// MetricNumber: a sample value as the Prometheus text exposition format writes it, exactly.
//
// Every /metrics writer in the tree (the controller's, the router's, the reference engine's)
// formats its values here, so that no byte count, epoch or counter is rounded on the way out:
// an integral value is written as an integer with every digit (2097152, not 2.09715e+06), any
// other finite value as the shortest decimal that reads back as the same double (0.1,
// 11.337612), and the non-finite ones as Prometheus spells them (NaN, +Inf, -Inf).
// Pure; thread-safe.
#pragma once

#include <string>

namespace baton {

std::string MetricNumber(double value);

}  // namespace baton
