#include "router/router_options.h"

#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <toml.hpp>

#include "base/io/small_file.h"
#include "base/text/toml_depth.h"
#include "fleet/json_http_client.h"
#include "fleet/tls_client_context.h"
#include "proto/http/engine_key.h"
#include "proto/messages.h"

namespace baton {
namespace {

// One setting, from a string (a flag) or a TOML value (converted to its string form).
using Setter = std::function<Status(const std::string& value)>;

Result<int64_t> ParseInt(const std::string& key, const std::string& text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) {
    return InvalidArgument(key + ": not an integer: \"" + text + "\"");
  }
  if (v < lo || v > hi) {
    return InvalidArgument(key + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], got " + text);
  }
  return static_cast<int64_t>(v);
}

Setter Millis(const std::string& key, std::chrono::milliseconds* out) {
  return [=](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t ms, ParseInt(key, v, 1, 86400000));
    *out = std::chrono::milliseconds(ms);
    return OkStatus();
  };
}

Setter Count(const std::string& key, int64_t lo, int64_t hi, size_t* out) {
  return [=](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t n, ParseInt(key, v, lo, hi));
    *out = static_cast<size_t>(n);
    return OkStatus();
  };
}

// "30,60,100": percentages, rising, the last 100.
Status ParseRampSteps(const std::string& text, std::vector<double>* out) {
  std::vector<double> steps;
  std::stringstream in(text);
  std::string item;
  int64_t last = 0;
  while (std::getline(in, item, ',')) {
    BATON_ASSIGN_OR_RETURN(int64_t pct, ParseInt("ramp-steps", item, 1, 100));
    if (pct <= last) return InvalidArgument("ramp-steps: percentages must rise, got " + text);
    last = pct;
    steps.push_back(static_cast<double>(pct) / 100.0);
  }
  if (last != 100) return InvalidArgument("ramp-steps: the last step must be 100, got " + text);
  *out = std::move(steps);
  return OkStatus();
}

// --etcd A,B,C and the fleet's other flags.
void AddFleetSetters(RouterOptions* o, std::map<std::string, Setter>* s) {
  (*s)["etcd"] = [o](const std::string& v) -> Status {
    std::vector<std::string> endpoints;
    std::stringstream in(v);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (item.empty()) return InvalidArgument("etcd: an empty endpoint in \"" + v + "\"");
      if (Status ok = CheckHttpEndpoint(item); !ok.ok()) {
        return InvalidArgument("etcd: " + ok.message());
      }
      endpoints.push_back(item);
    }
    if (endpoints.empty()) return InvalidArgument("etcd: want host:port[,host:port...]");
    o->etcd = std::move(endpoints);
    return OkStatus();
  };
  (*s)["etcd-prefix"] = [o](const std::string& v) -> Status {
    if (v.size() < 2 || v.front() != '/' || v.back() != '/') {
      return InvalidArgument("etcd-prefix: want a prefix that begins and ends with '/', got \"" +
                             v + "\"");
    }
    o->etcd_prefix = v;
    return OkStatus();
  };
  (*s)["etcd-timeout-ms"] = Millis("etcd-timeout-ms", &o->etcd_timeout);
  for (auto [flag, out] : {std::pair{"etcd-ca-file", &o->etcd_ca_file},
                           std::pair{"etcd-cert-file", &o->etcd_cert_file},
                           std::pair{"etcd-key-file", &o->etcd_key_file}}) {
    (*s)[flag] = [flag = flag, out = out](const std::string& v) -> Status {
      BATON_RETURN_IF_ERROR(CheckReadableFile(flag, v));
      *out = v;
      return OkStatus();
    };
  }
  (*s)["fleet-poll-ms"] = Millis("fleet-poll-ms", &o->fleet_poll);
  (*s)["fleet-suspect-ms"] = Millis("fleet-suspect-ms", &o->fleet_suspect);
  (*s)["fleet-router-name"] = [o](const std::string& v) -> Status {
    if (v.empty() || v.find_first_of("/ \t\n") != std::string::npos) {
      return InvalidArgument("fleet-router-name: want a name without '/' or spaces");
    }
    o->fleet_router_name = v;
    return OkStatus();
  };
}

// The rules across the etcd flags, once every flag is read.
Status CheckEtcdTls(const RouterOptions& o) {
  const bool tls = !o.etcd_ca_file.empty();
  if (o.etcd_cert_file.empty() != o.etcd_key_file.empty()) {
    return InvalidArgument(o.etcd_cert_file.empty() ? "--etcd-key-file needs --etcd-cert-file"
                                                    : "--etcd-cert-file needs --etcd-key-file");
  }
  if (!tls && !o.etcd_cert_file.empty()) {
    return InvalidArgument(
        "--etcd-cert-file needs --etcd-ca-file (the CA that signs the members' certificates)");
  }
  for (const std::string& e : o.etcd) {
    if (!tls && e.rfind("https://", 0) == 0) {
      return InvalidArgument("--etcd " + e +
                             " is https: --etcd-ca-file must name the CA that signs the "
                             "members' certificates");
    }
    if (tls && e.rfind("http://", 0) == 0) {
      return InvalidArgument("--etcd " + e +
                             " is plain http while --etcd-ca-file is set (write https://)");
    }
  }
  return OkStatus();
}

// A fleet flag without --etcd would be dropped without a word: the router would follow one
// controller while its operator believes it follows the fleet.
Status CheckFleetFlagsNeedEtcd(const RouterOptions& o) {
  if (!o.etcd.empty()) return OkStatus();
  const RouterOptions d;
  const std::pair<const char*, bool> set[] = {
      {"etcd-prefix", o.etcd_prefix != d.etcd_prefix},
      {"etcd-timeout-ms", o.etcd_timeout != d.etcd_timeout},
      {"etcd-ca-file", !o.etcd_ca_file.empty()},
      {"etcd-cert-file", !o.etcd_cert_file.empty()},
      {"etcd-key-file", !o.etcd_key_file.empty()},
      {"fleet-poll-ms", o.fleet_poll != d.fleet_poll},
      {"fleet-suspect-ms", o.fleet_suspect != d.fleet_suspect},
      {"fleet-router-name", !o.fleet_router_name.empty()},
  };
  for (const auto& [flag, given] : set) {
    if (given) {
      return InvalidArgument(std::string("--") + flag +
                             " is a fleet setting and needs --etcd (the members to read the "
                             "fleet from)");
    }
  }
  return OkStatus();
}

std::map<std::string, Setter> Setters(RouterOptions* o) {
  std::map<std::string, Setter> s;
  s["listen"] = [o](const std::string& v) {
    return SplitHostPort(v, "listen", &o->listen_host, &o->listen_port);
  };
  s["controller"] = [o](const std::string& v) {
    o->controller_socket = v;
    return OkStatus();
  };
  s["backend"] = [o](const std::string& v) {
    std::string host;
    uint16_t port = 0;
    BATON_RETURN_IF_ERROR(SplitHostPort(v, "backend", &host, &port));
    o->backend = v;
    return OkStatus();
  };
  s["api-key"] = [o](const std::string& v) {
    o->api_key = v;
    return OkStatus();
  };
  s["engine-key-file"] = [o](const std::string& v) -> Status {
    BATON_RETURN_IF_ERROR(CheckEngineKeyFileSetting("engine-key-file", v));
    o->engine_key_file = v;
    return OkStatus();
  };
  s["max-body-bytes"] = [o](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t n, ParseInt("max-body-bytes", v, 1, int64_t{1} << 32));
    o->max_body_bytes = static_cast<size_t>(n);
    return OkStatus();
  };
  s["threads"] = [o](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t n, ParseInt("threads", v, 1, 256));
    o->threads = static_cast<int>(n);
    return OkStatus();
  };
  s["connect-timeout-ms"] = Millis("connect-timeout-ms", &o->connect_timeout);
  s["first-byte-timeout-ms"] = Millis("first-byte-timeout-ms", &o->first_byte_timeout);
  s["stream-idle-timeout-ms"] = Millis("stream-idle-timeout-ms", &o->stream_idle_timeout);
  s["stall-timeout-ms"] = [o](const std::string& v) -> Status {  // 0 turns it off
    BATON_ASSIGN_OR_RETURN(int64_t ms, ParseInt("stall-timeout-ms", v, 0, 86400000));
    if (ms != 0 && static_cast<uint64_t>(ms) < proto::kMinStallQuietMs) {
      return InvalidArgument("stall-timeout-ms: must be 0 (off) or at least " +
                             std::to_string(proto::kMinStallQuietMs) + ", got " + v);
    }
    o->stall_timeout = std::chrono::milliseconds(ms);
    return OkStatus();
  };
  s["engine-retention-ms"] = [o](const std::string& v) -> Status {  // 0: never forgotten
    BATON_ASSIGN_OR_RETURN(int64_t ms, ParseInt("engine-retention-ms", v, 0, 30 * 86400000LL));
    o->engine_retention = std::chrono::milliseconds(ms);
    return OkStatus();
  };
  s["request-timeout-ms"] = Millis("request-timeout-ms", &o->request_timeout);
  s["client-idle-timeout-ms"] = Millis("client-idle-timeout-ms", &o->client_idle_timeout);
  s["max-queue-wait-ms"] = Millis("max-queue-wait-ms", &o->max_queue_wait);
  s["max-connections"] = Count("max-connections", 1, 1 << 20, &o->max_connections);
  s["max-queue"] = Count("max-queue", 0, 1 << 20, &o->max_queue);
  s["max-header-bytes"] = [o](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t n, ParseInt("max-header-bytes", v, 1024, 1 << 20));
    o->max_header_bytes = static_cast<uint32_t>(n);
    return OkStatus();
  };
  s["migration-limit"] = [o](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t n, ParseInt("migration-limit", v, 0, 100));
    o->migration_limit = static_cast<int>(n);
    return OkStatus();
  };
  s["shadow-every"] = [o](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t n, ParseInt("shadow-every", v, 0, 1000000));
    o->shadow_every = static_cast<int>(n);
    return OkStatus();
  };
  s["ramp-duration-ms"] = [o](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t n, ParseInt("ramp-duration-ms", v, 0, 600000));
    o->ramp_duration = std::chrono::milliseconds(n);
    return OkStatus();
  };
  s["ramp-steps"] = [o](const std::string& v) { return ParseRampSteps(v, &o->ramp_steps); };
  s["drain-delay-ms"] = [o](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t n, ParseInt("drain-delay-ms", v, 0, 3'600'000));
    o->drain_delay = std::chrono::milliseconds(n);
    return OkStatus();
  };
  s["drain-timeout-ms"] = [o](const std::string& v) -> Status {
    BATON_ASSIGN_OR_RETURN(int64_t n, ParseInt("drain-timeout-ms", v, 0, 3'600'000));
    o->drain_timeout = std::chrono::milliseconds(n);
    return OkStatus();
  };
  AddFleetSetters(o, &s);
  return s;
}

std::string Dashes(std::string key) {
  for (char& c : key) {
    if (c == '_') c = '-';
  }
  return key;
}

// A TOML value as its flag text: a string, an integer, or an array of integers or of strings
// joined with commas (ramp_steps = [30, 60, 100], as the controller's upgrade.steps is written;
// etcd = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"], as the controller's fleet.etcd).
Result<std::string> TomlText(const toml::value& v) {
  if (v.is_string()) return std::string(v.as_string());
  if (v.is_integer()) return std::to_string(v.as_integer());
  if (v.is_array()) {
    std::string joined;
    for (const toml::value& item : v.as_array()) {
      std::string text;
      if (item.is_integer()) {
        text = std::to_string(item.as_integer());
      } else if (item.is_string() && !item.as_string().str.empty() &&
                 item.as_string().str.find(',') == std::string::npos) {
        text = item.as_string().str;
      } else {
        return InvalidArgument("want an array of integers or of strings without commas");
      }
      joined += (joined.empty() ? "" : ",") + text;
    }
    return joined;
  }
  if (v.is_floating()) {
    std::ostringstream text;
    text << v.as_floating();
    return InvalidArgument("want an integer, got " + text.str());
  }
  return InvalidArgument(std::string("want a string, an integer or an array, got ") +
                         (v.is_boolean() ? "a boolean" : "a table or a date"));
}

}  // namespace

std::string RouterDefaultRuntimeDir() {
  if (const char* dir = std::getenv("BATON_RUNTIME_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return "/tmp/baton-" + std::to_string(::getuid());
}

Status SplitHostPort(const std::string& text, const std::string& what, std::string* host,
                     uint16_t* port) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgument(what + ": want HOST:PORT, got \"" + text + "\"");
  }
  BATON_ASSIGN_OR_RETURN(int64_t p, ParseInt(what + " port", text.substr(colon + 1), 0, 65535));
  *host = text.substr(0, colon);
  *port = static_cast<uint16_t>(p);
  return OkStatus();
}

Status ParseRouterToml(const std::string& text, const std::string& source, RouterOptions* options) {
  std::map<std::string, Setter> setters = Setters(options);
  try {
    BATON_RETURN_IF_ERROR(CheckTomlDepth(text, source));
    std::istringstream in(text);
    const toml::value root = toml::parse(in, source);
    for (const auto& [table, value] : root.as_table()) {
      if (table != "router" || !value.is_table()) {
        return InvalidArgument(source + ": unknown key \"" + table + "\" (want a [router] table)");
      }
      for (const auto& [key, v] : value.as_table()) {
        auto it = setters.find(Dashes(key));
        if (it == setters.end()) return InvalidArgument(source + ": unknown key router." + key);
        Result<std::string> text = TomlText(v);
        if (!text.ok())
          return InvalidArgument(source + ": router." + key + ": " + text.status().message());
        if (Status st = it->second(*text); !st.ok()) {
          // The setter names the flag (max-queue-wait-ms); the file's reader wrote the key.
          std::string message = st.message();
          if (message.rfind(Dashes(key), 0) == 0) message = key + message.substr(key.size());
          return InvalidArgument(source + ": router." + message);
        }
      }
    }
  } catch (const std::exception& e) {
    return InvalidArgument(source + ": " + e.what());
  }
  return OkStatus();
}

Result<RouterOptions> ParseRouterFlags(const std::vector<std::string>& args) {
  RouterOptions options;
  // The file first, so that flags override it wherever they stand: "--config FILE" or
  // "--config=FILE".
  for (size_t i = 0; i < args.size(); ++i) {
    std::string path;
    if (args[i] == "--config" && i + 1 < args.size()) {
      path = args[i + 1];
    } else if (args[i].rfind("--config=", 0) == 0) {
      path = args[i].substr(9);
    } else {
      continue;
    }
    if (path.empty()) return InvalidArgument("--config: cannot read \"\"");
    Result<std::string> text = ReadRegularFile(path, kMaxConfigFileBytes);
    if (!text.ok()) return InvalidArgument("--config: " + text.status().message());
    BATON_RETURN_IF_ERROR(ParseRouterToml(*text, path, &options));
  }
  std::map<std::string, Setter> setters = Setters(&options);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    if (flag.rfind("--", 0) != 0) return InvalidArgument("unexpected argument \"" + flag + "\"");
    flag = flag.substr(2);
    std::string value;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    // Named before a value is looked for: a mistyped flag is no flag that needs one.
    auto it = setters.find(flag);
    if (flag != "config" && it == setters.end()) {
      return InvalidArgument("unknown flag --" + flag + " (see --help)");
    }
    if (eq == std::string::npos) {
      if (i + 1 >= args.size()) return InvalidArgument("--" + flag + ": missing value");
      value = args[++i];
    }
    if (flag == "config") continue;
    if (Status st = it->second(value); !st.ok()) return InvalidArgument("--" + st.message());
  }
  if (options.controller_socket.empty()) {
    options.controller_socket = RouterDefaultRuntimeDir() + "/controller.sock";
  }
  BATON_RETURN_IF_ERROR(CheckEtcdTls(options));
  BATON_RETURN_IF_ERROR(CheckFleetFlagsNeedEtcd(options));
  if (!options.etcd.empty() && !options.backend.empty()) {
    return InvalidArgument(
        "--etcd and --backend exclude each other: a router follows a fleet or "
        "one static backend");
  }
  return options;
}

}  // namespace baton
