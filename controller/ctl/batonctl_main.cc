// batonctl: the operator's command line for a running baton-controller. It talks only to
// the controller's Unix socket (Hello role "cli", one CtlRequest, one CtlReply).
// Exit status: 0 done, 1 refused or unreachable (the reason is printed), 2 bad usage.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/build_info.h"
#include "base/io/private_dir.h"
#include "base/io/small_file.h"
#include "base/log.h"
#include "controller/config.h"
#include "controller/ctl/ctl_service.h"
#include "controller/rollout/ctl_rollout.h"
#include "proto/hello.h"
#include "proto/transport/listener.h"

namespace baton {
namespace {

struct Args {
  bool json = false;
  std::string socket;
  std::string config;  // the controller's config file: the socket is in its runtime_dir
  int timeout_ms = 10'000;
  std::string command;
  std::vector<std::string> rest;
};

constexpr long kMaxTimeoutMs = 24L * 3600 * 1000;

// With --json on the line (before "--": after it, it belongs to an engine command), bad usage
// and --help also print a JSON object on stdout.
bool WantsJson(int argc, char** argv) {
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) return true;
  }
  return false;
}

std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// --help (`why` empty): the usage text on stdout, exit 0. A usage error: the error and a hint
// at --help on stderr, exit 2; the whole usage text only when no command was given (`full`),
// so that a one-line error is not buried. With --json, the JSON object comes last on stdout.
int Usage(const std::string& why, bool json, bool full = false) {
  if (why.empty()) {
    std::fputs(CtlUsage(), stdout);
  } else if (full) {
    std::fprintf(stderr, "batonctl: %s\n\n%s", why.c_str(), CtlUsage());
  } else {
    std::fprintf(stderr, "batonctl: %s\n%s\n", why.c_str(), CtlUsageHint());
  }
  if (json) {
    const nlohmann::json line = why.empty() ? nlohmann::json{{"ok", true}, {"usage", CtlUsage()}}
                                            : nlohmann::json{{"ok", false}, {"error", why}};
    std::printf("%s\n", Dump(line).c_str());
  }
  return why.empty() ? 0 : 2;
}

// A parser's message on one line: its first line, and where (toml11 draws the place over
// several: " --> file", then " 3 | the line").
std::string OneLine(const std::string& message) {
  std::istringstream in(message);
  std::string first, line, file, number;
  std::getline(in, first);
  while (std::getline(in, line)) {
    const size_t digits = line.find_first_not_of(' ');
    if (const size_t at = line.find("--> "); at != std::string::npos && file.empty()) {
      file = line.substr(at + 4);
    } else if (!file.empty() && number.empty() && digits != std::string::npos &&
               std::isdigit(static_cast<unsigned char>(line[digits]))) {
      number = line.substr(digits, line.find(' ', digits) - digits);
    }
  }
  if (file.empty()) return first;
  return first + " (at " + file + (number.empty() ? "" : ":" + number) + ")";
}

// Returns -1 when the arguments are good, else the exit status.
int ParseArgs(int argc, char** argv, Args* args) {
  const bool json = WantsJson(argc, argv);
  auto usage = [json](const std::string& why) { return Usage(why, json); };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // upgrade's and rollback's own options, and the engine command after "--", pass through;
    // batonctl's options before "--" are batonctl's.
    const bool batonctl_option = a == "--json" || a == "--socket" || a == "--config" ||
                                 a == "--timeout-ms" || a == "--help" || a == "-h";
    const bool passing =
        args->command == "upgrade" || args->command == "rollback" || args->command == "fleet";
    if (passing && (!batonctl_option ||
                    std::find(args->rest.begin(), args->rest.end(), "--") != args->rest.end())) {
      args->rest.push_back(a);
      continue;
    }
    if (a == "--help" || a == "-h") return Usage("", json);
    if (a == "--json") {
      args->json = true;
    } else if (a == "--socket" || a == "--config" || a == "--timeout-ms") {
      if (i + 1 >= argc) return usage(a + " needs a value");
      const std::string v = argv[++i];
      if (a == "--socket") {
        args->socket = v;
      } else if (a == "--config") {
        args->config = v;
      } else {
        char* end = nullptr;
        const long ms = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || ms <= 0 || ms > kMaxTimeoutMs) {
          return usage("--timeout-ms needs a number of milliseconds from 1 to " +
                       std::to_string(kMaxTimeoutMs));
        }
        args->timeout_ms = static_cast<int>(ms);
      }
    } else if (a == "--") {
      return usage("'--' comes before an engine command: upgrade's, or fleet upgrade's");
    } else if (a.size() > 1 && a[0] == '-') {
      return usage("unknown option '" + a + "'");
    } else if (args->command.empty()) {
      args->command = a;
    } else {
      args->rest.push_back(a);
    }
  }
  static const std::set<std::string> kCommands = {"status", "promote",   "drain",   "resume",
                                                  "drill",  "timeline",  "upgrade", "rollback",
                                                  "fleet",  "controller"};
  if (args->command.empty()) return Usage("no command given", json, /*full=*/true);
  if (kCommands.count(args->command) == 0) return usage("unknown command '" + args->command + "'");
  const Status checked = args->command == "fleet" ? CheckFleetArgs(args->rest)
                                                  : CheckCtlArgs(args->command, args->rest);
  if (!checked.ok()) return usage(checked.message());
  if (!args->socket.empty() && !args->config.empty()) {
    return usage("--socket and --config exclude each other");
  }
  if (!args->config.empty()) {
    Result<ControllerConfig> config = LoadConfigFile(args->config);
    if (!config.ok()) return usage("--config: " + OneLine(config.status().message()));
    if (config->runtime_dir.empty()) config->runtime_dir = DefaultRuntimeDir();
    args->socket = config->socket_path();
  }
  if (args->socket.empty()) args->socket = DefaultRuntimeDir() + "/controller.sock";
  return -1;
}

Result<proto::CtlReply> Ask(const Args& args) {
  // A socket in a directory another user made may be theirs (base/io/private_dir.h).
  const Status dir =
      CheckPrivateDir(ParentDir(args.socket), DirOwner::kSelfOrRoot, "runtime directory",
                      "BATON_RUNTIME_DIR (or --config, --socket)");
  if (!dir.ok() && dir.code() != StatusCode::kNotFound) return dir;
  boost::asio::io_context io;
  proto::ChannelOptions options{.label = "controller at " + args.socket};
  // A frozen controller with a full backlog would hold connect(2) forever.
  BATON_ASSIGN_OR_RETURN(
      proto::Channel channel,
      proto::Connect(io, args.socket, options, std::chrono::milliseconds(args.timeout_ms)));
  proto::ClientHelloOptions hello{
      .peer_name = "batonctl", .role = proto::PeerRole::kCli, .launch_token = ""};
  hello.timeout = std::chrono::milliseconds(args.timeout_ms);
  BATON_RETURN_IF_ERROR(proto::ClientHello(channel, hello).status());
  BATON_RETURN_IF_ERROR(
      channel.Send(proto::CtlRequest{.command = args.command, .args = args.rest}));
  BATON_ASSIGN_OR_RETURN(proto::ReceivedMessage msg,
                         channel.Receive(std::chrono::milliseconds(args.timeout_ms)));
  return msg.As<proto::CtlReply>();
}

// `fleet upgrade --wait`: whether --wait is among fleet upgrade's own options.
bool WaitsForRollout(const Args& args) {
  if (args.command != "fleet" || args.rest.empty() || args.rest[0] != "upgrade") return false;
  const auto end = std::find(args.rest.begin(), args.rest.end(), "--");
  return std::find(args.rest.begin(), end, "--wait") != end;
}

// Polls `fleet rollout` until the rollout settles, printing it whenever it changes (text), or
// its last state as the JSON line. The state lives in etcd: a controller that restarts
// meanwhile, or a batonctl killed and started again, loses nothing. Exit 0 when every node was
// promoted, 1 otherwise. `id` is the rollout this batonctl started: a record of another rollout
// (one started once it settled) is not followed as its.
int WaitRollout(const Args& args, const std::string& id) {
  constexpr int kMaxMisses = 120;  // a minute of unanswered polls
  Args poll = args;
  poll.rest = {"rollout"};
  std::string shown;
  int misses = 0;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    Result<proto::CtlReply> reply = Ask(poll);
    nlohmann::json j;
    if (reply.ok() && reply->exit_code == 0) j = nlohmann::json::parse(reply->json, nullptr, false);
    if (!j.is_object() || !j.contains("settled")) {
      const std::string why = !reply.ok() ? reply.status().message() : reply->text;
      if (++misses == 1 || misses % 20 == 0) {
        std::fprintf(stderr, "batonctl: waiting for the rollout: %s\n", why.c_str());
      }
      if (misses < kMaxMisses) continue;
      if (args.json) std::printf("%s\n", Dump({{"ok", false}, {"error", why}}).c_str());
      return 1;
    }
    misses = 0;
    if (!id.empty() && (!j["rollout"].is_object() || j["rollout"].value("id", "") != id)) {
      const std::string why = "rollout " + id + " is no longer the fleet's rollout record (" +
                              (j["rollout"].is_object() ? "now " + j["rollout"].value("id", "?")
                                                        : std::string("gone")) +
                              "); look at `batonctl fleet rollout`";
      std::fprintf(stderr, "batonctl: %s\n", why.c_str());
      if (args.json) std::printf("%s\n", Dump({{"ok", false}, {"error", why}}).c_str());
      return 1;
    }
    if (!args.json && reply->text != shown) {
      shown = reply->text;
      std::printf("%s%s", shown.c_str(), !shown.empty() && shown.back() == '\n' ? "" : "\n");
      std::fflush(stdout);
    }
    if (!j["settled"].get<bool>()) continue;
    const bool done = j["rollout"].is_object() && j["rollout"]["state"] == "done";
    if (!done) j["ok"] = false;
    if (args.json) std::printf("%s\n", Dump(j).c_str());
    if (!done) {
      std::fprintf(stderr, "batonctl: the rollout did not promote every node: %s\n",
                   j["rollout"].is_object() ? j["rollout"]["reason"].get<std::string>().c_str()
                                            : "its record is gone");
    }
    return done ? 0 : 1;
  }
}

int Run(int argc, char** argv) {
  if (!EnvironmentLogLevel().has_value()) {
    SetLogLevel(LogLevel::kError);  // a CLI prints its own errors
  }
  if (WantsVersion(argc, argv)) {
    if (WantsJson(argc, argv)) {  // one JSON object, as every --json command prints
      const BuildInfo& b = GetBuildInfo();
      std::printf("%s\n", Dump({{"ok", true},
                                {"program", "batonctl"},
                                {"version", std::string(b.version)},
                                {"commit", std::string(b.commit)},
                                {"build_type", std::string(b.build_type)},
                                {"line", VersionLine("batonctl")}})
                              .c_str());
    } else {
      std::printf("%s\n", VersionLine("batonctl").c_str());
    }
    return 0;
  }
  Args args;
  if (const int code = ParseArgs(argc, argv, &args); code >= 0) return code;
  Result<proto::CtlReply> reply = Ask(args);
  if (!reply.ok()) {
    const std::string why =
        "cannot reach the controller at " + args.socket + ": " + reply.status().message();
    std::fprintf(stderr, "batonctl: %s\n", why.c_str());
    if (args.json) {
      std::printf("%s\n", Dump({{"ok", false}, {"error", why}}).c_str());
    }
    return 1;
  }
  if (reply->exit_code == 0 && WaitsForRollout(args)) {
    if (!args.json) std::printf("%s", reply->text.c_str());
    const nlohmann::json started = nlohmann::json::parse(reply->json, nullptr, false);
    std::string id;
    if (started.is_object() && started.contains("rollout") && started["rollout"].is_object()) {
      id = started["rollout"].value("id", "");
    }
    return WaitRollout(args, id);
  }
  if (args.json) {
    if (reply->exit_code != 0) std::fprintf(stderr, "batonctl: %s\n", reply->text.c_str());
    if (reply->json.empty()) {  // a reply without its object (a request the controller refused)
      reply->json = nlohmann::json{{"ok", reply->exit_code == 0}, {"error", reply->text}}.dump(
          -1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    std::printf("%s\n", reply->json.c_str());
  } else {
    // A refusal is batonctl's word on stderr, prefixed as its other errors are.
    std::FILE* out = reply->exit_code == 0 ? stdout : stderr;
    std::fprintf(out, "%s%s%s", reply->exit_code == 0 ? "" : "batonctl: ", reply->text.c_str(),
                 !reply->text.empty() && reply->text.back() == '\n' ? "" : "\n");
  }
  return reply->exit_code <= 2 ? static_cast<int>(reply->exit_code) : 1;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Run(argc, argv); }
