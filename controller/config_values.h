// The typed setters of the controller's configuration keys: each turns a TOML value (from the
// file, or a flag's text read as TOML) into a field of ControllerConfig, or says why not.
// Internal to controller/config.cc and its tests.
#ifndef BATON_CONTROLLER_CONFIG_VALUES_H_
#define BATON_CONTROLLER_CONFIG_VALUES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <toml.hpp>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace baton {
namespace config_values {

// Stores a value into the field it was made for; InvalidArgument says why a value is refused.
using Setter = std::function<Status(const toml::value&)>;

// InvalidArgument "expected <want>, got <the value>": a string in quotes, a number or boolean
// as written, "an array", "a table".
Status WrongType(const toml::value& v, const char* want);

// An integer in [lo, hi].
Result<int64_t> AsInt(const toml::value& v, int64_t lo, int64_t hi);

// A positive size: an integer, or text such as "4096", "512KiB", "2MiB", "1GiB".
Result<uint64_t> AsSize(const toml::value& v);

Setter Int(int* out, int64_t lo, int64_t hi);
Setter U32(uint32_t* out, int64_t lo, int64_t hi);
Setter U64(uint64_t* out, int64_t lo, int64_t hi);
Setter Size(uint64_t* out);
// A size as Size(), or 0 (an integer) for "none".
Setter SizeOrZero(uint64_t* out);
Setter Bool(bool* out);
Setter Str(std::string* out);

// A list: a TOML array of strings, or one string of comma-separated ones (blanks around each
// trimmed, empty ones dropped).
Setter StringList(std::vector<std::string>* out);
// A list of endpoints, read as StringList.
Setter Endpoints(std::vector<std::string>* out);

// An engine command: an array of strings, or one command line split as a shell would
// (SplitCommandLine in config.h).
Setter Command(std::vector<std::string>* out);

// A number in [lo, hi]: a TOML float or integer, or (from a flag) its text.
Setter Number(double* out, double lo, double hi);

// Canary steps: an array of percentages, or their text "10,50,100".
Setter Steps(std::vector<uint32_t>* out);

// An integer in [lo, hi] counted in Unit (std::chrono::milliseconds, seconds).
template <typename Unit>
Setter Time(Duration* out, int64_t lo, int64_t hi) {
  return [=](const toml::value& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t x, AsInt(v, lo, hi));
    *out = Unit(x);
    return OkStatus();
  };
}

}  // namespace config_values
}  // namespace baton

#endif  // BATON_CONTROLLER_CONFIG_VALUES_H_
