#include "controller/config_values.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>

#include "controller/config.h"
#include "controller/core/canary.h"

namespace baton {
namespace config_values {

namespace {

// A value as an error quotes it: a string in quotes (a flag's text is one), a number or a
// boolean as written, else its kind.
std::string Quoted(const toml::value& v) {
  std::ostringstream out;
  if (v.is_string()) {
    out << '"' << v.as_string().str << '"';
  } else if (v.is_integer()) {
    out << v.as_integer();
  } else if (v.is_floating()) {
    out << v.as_floating();
  } else if (v.is_boolean()) {
    out << (v.as_boolean() ? "true" : "false");
  } else if (v.is_array()) {
    out << "an array";
  } else if (v.is_table()) {
    out << "a table";
  } else {
    out << v.type();
  }
  return out.str();
}

}  // namespace

Status WrongType(const toml::value& v, const char* want) {
  return InvalidArgument(std::string("expected ") + want + ", got " + Quoted(v));
}

Result<int64_t> AsInt(const toml::value& v, int64_t lo, int64_t hi) {
  if (!v.is_integer()) return WrongType(v, "an integer");
  const int64_t x = v.as_integer();
  if (x < lo || x > hi) {
    // The TOML parser saturates a literal past the 64-bit range to its limit.
    const bool saturated =
        x == std::numeric_limits<int64_t>::max() || x == std::numeric_limits<int64_t>::min();
    return InvalidArgument(
        "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
        (saturated ? "a number at or past the 64-bit limit" : std::to_string(x)));
  }
  return x;
}

// "2MiB", "512KiB", "1GiB", "4096" or an integer; at most 2^50 bytes (1 PiB).
Result<uint64_t> AsSize(const toml::value& v) {
  constexpr uint64_t kMaxSize = 1ull << 50;
  if (v.is_integer()) {
    if (v.as_integer() <= 0) return InvalidArgument("must be positive");
    if (static_cast<uint64_t>(v.as_integer()) > kMaxSize) {
      return InvalidArgument("size too large: " + std::to_string(v.as_integer()));
    }
    return static_cast<uint64_t>(v.as_integer());
  }
  if (!v.is_string()) return WrongType(v, "a size (integer or \"2MiB\")");
  const std::string text = v.as_string().str;
  size_t pos = 0;
  uint64_t n = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    n = n * 10 + static_cast<uint64_t>(text[pos++] - '0');
    if (n > kMaxSize) return InvalidArgument("size too large: " + text);
  }
  static const std::map<std::string, uint64_t> kUnits = {
      {"", 1}, {"B", 1}, {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}};
  auto unit = kUnits.find(text.substr(pos));
  if (pos == 0 || unit == kUnits.end() || n == 0) {
    return InvalidArgument("not a size: '" + text + "' (use e.g. 65536, \"64KiB\", \"2MiB\")");
  }
  if (n > kMaxSize / unit->second) return InvalidArgument("size too large: " + text);
  return n * unit->second;
}

Setter Int(int* out, int64_t lo, int64_t hi) {
  return [=](const toml::value& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t x, AsInt(v, lo, hi));
    *out = static_cast<int>(x);
    return OkStatus();
  };
}

Setter U32(uint32_t* out, int64_t lo, int64_t hi) {
  return [=](const toml::value& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t x, AsInt(v, lo, hi));
    *out = static_cast<uint32_t>(x);
    return OkStatus();
  };
}

Setter Size(uint64_t* out) {
  return [=](const toml::value& v) -> Status {
    BATON_ASSIGN_OR_RETURN(*out, AsSize(v));
    return OkStatus();
  };
}

Setter SizeOrZero(uint64_t* out) {
  return [=](const toml::value& v) -> Status {
    if (v.is_integer() && v.as_integer() == 0) {
      *out = 0;
      return OkStatus();
    }
    BATON_ASSIGN_OR_RETURN(*out, AsSize(v));
    return OkStatus();
  };
}

Setter Bool(bool* out) {
  return [=](const toml::value& v) -> Status {
    if (!v.is_boolean()) return WrongType(v, "true or false");
    *out = v.as_boolean();
    return OkStatus();
  };
}

Setter StringList(std::vector<std::string>* out) {
  return [=](const toml::value& v) -> Status {
    std::vector<std::string> list;
    if (v.is_string()) {
      std::string text = v.as_string().str;
      for (size_t start = 0; start <= text.size();) {
        const size_t comma = std::min(text.find(',', start), text.size());
        std::string item = text.substr(start, comma - start);
        item.erase(0, item.find_first_not_of(" \t"));
        item.erase(item.find_last_not_of(" \t") + 1);
        if (!item.empty()) list.push_back(std::move(item));
        start = comma + 1;
      }
    } else if (v.is_array()) {
      for (const toml::value& e : v.as_array()) {
        if (!e.is_string()) return WrongType(e, "a string");
        list.push_back(e.as_string().str);
      }
    } else {
      return WrongType(v, "an array of strings or a comma-separated string");
    }
    *out = std::move(list);
    return OkStatus();
  };
}

Setter Endpoints(std::vector<std::string>* out) { return StringList(out); }

Setter Str(std::string* out) {
  return [=](const toml::value& v) -> Status {
    if (!v.is_string()) return WrongType(v, "a string");
    *out = v.as_string().str;
    return OkStatus();
  };
}

Setter Command(std::vector<std::string>* out) {
  return [=](const toml::value& v) -> Status {
    if (v.is_string()) {
      BATON_ASSIGN_OR_RETURN(*out, SplitCommandLine(v.as_string().str));
      return OkStatus();
    }
    if (!v.is_array()) return WrongType(v, "an array of strings or a command line string");
    out->clear();
    for (const toml::value& item : v.as_array()) {
      if (!item.is_string()) return WrongType(item, "a string in the command array");
      out->push_back(item.as_string().str);
    }
    return OkStatus();
  };
}

// A number in [lo, hi]: a TOML float or integer, or (from a flag) its text.
Setter Number(double* out, double lo, double hi) {
  return [=](const toml::value& v) -> Status {
    double x = 0;
    if (v.is_floating()) {
      x = v.as_floating();
    } else if (v.is_integer()) {
      x = static_cast<double>(v.as_integer());
    } else if (v.is_string()) {
      char* end = nullptr;
      x = std::strtod(v.as_string().str.c_str(), &end);
      if (v.as_string().str.empty() || *end != '\0') return WrongType(v, "a number");
    } else {
      return WrongType(v, "a number");
    }
    if (!(x >= lo && x <= hi)) {
      return InvalidArgument("must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                             "], got " + std::to_string(x));
    }
    *out = x;
    return OkStatus();
  };
}

// Canary steps: an array of percentages, or their text "10,50,100".
Setter Steps(std::vector<uint32_t>* out) {
  return [=](const toml::value& v) -> Status {
    std::string text;
    if (v.is_string()) {
      text = v.as_string().str;
    } else if (v.is_integer()) {
      text = std::to_string(v.as_integer());
    } else if (v.is_array()) {
      for (const toml::value& item : v.as_array()) {
        if (!item.is_integer()) return WrongType(item, "an integer percentage");
        text += (text.empty() ? "" : ",") + std::to_string(item.as_integer());
      }
    } else {
      return WrongType(v, "an array of percentages");
    }
    BATON_ASSIGN_OR_RETURN(*out, ParseCanarySteps(text));
    return OkStatus();
  };
}

Setter U64(uint64_t* out, int64_t lo, int64_t hi) {
  return [=](const toml::value& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t x, AsInt(v, lo, hi));
    *out = static_cast<uint64_t>(x);
    return OkStatus();
  };
}

}  // namespace config_values
}  // namespace baton
