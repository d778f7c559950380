#include "standby/refengine_flags.h"

#include <charconv>
#include <filesystem>
#include <string_view>

#include "proto/roles.h"

namespace baton {
namespace {

template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

// Returns an error message, or empty on success.
std::string ParseInt(std::string_view flag, std::string_view v, int lo, int hi, int* out) {
  if (!ParseNumber(v, out) || *out < lo || *out > hi) {
    return std::string(flag) + ": not a number in [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]: " + std::string(v);
  }
  return "";
}

std::string ApplyFlag(std::string_view arg, std::string_view v, RefEngineFlags* f) {
  if (arg == "--model")
    f->model = v;
  else if (arg == "--host")
    f->host = v;
  else if (arg == "--port")
    return ParseInt(arg, v, 0, 65535, &f->port);
  else if (arg == "--port-file")
    f->port_file = v;
  else if (arg == "--kv-blocks")
    return ParseInt(arg, v, 1, 1 << 24, &f->kv_blocks);
  else if (arg == "--block-tokens")
    return ParseInt(arg, v, 1, 4096, &f->block_tokens);
  else if (arg == "--threads")
    return ParseInt(arg, v, 1, 256, &f->threads);
  else if (arg == "--max-batch")
    return ParseInt(arg, v, 1, 4096, &f->max_batch);
  else if (arg == "--max-step-tokens")
    return ParseInt(arg, v, 1, 1 << 20, &f->max_step_tokens);
  else if (arg == "--served-model-name")
    f->served_name = v;
  else if (arg == "--controller")
    f->controller = v;
  else if (arg == "--token")
    f->token = v;
  else if (arg == "--role")
    f->role = v;
  else if (arg == "--engine-id")
    f->engine_id = v;
  else if (arg == "--engine-version")
    f->engine_version = v;
  else if (arg == "--fail-percent")
    return ParseInt(arg, v, 0, 100, &f->fail_percent);
  else if (arg == "--seed-offset")
    return ParseInt(arg, v, 0, 1 << 30, &f->seed_offset);
  else if (arg == "--kv-handoff" && (v == "on" || v == "off"))
    f->kv_handoff = v == "on";
  else if (arg == "--kv-handoff")
    return "--kv-handoff must be on or off";
  else if (arg == "--kv-format" && !v.empty())
    f->kv_format = v;
  else if (arg == "--kv-keep-ms")
    return ParseInt(arg, v, 0, 1 << 30, &f->kv_keep_ms);
  else if (arg == "--step-interval-ms")
    return ParseInt(arg, v, 0, 60000, &f->step_interval_ms);
  else
    return "unknown argument: " + std::string(arg);
  return "";
}

}  // namespace

const char kRefEngineUsage[] =
    "usage: baton-refengine --model DIR [--host H] [--port N] [--port-file F]\n"
    "                       [--kv-blocks N] [--block-tokens T] [--threads K] [--max-batch B]\n"
    "                       [--max-step-tokens S] [--served-model-name NAME]\n"
    "                       [--engine-version LABEL] [--fail-percent P] [--seed-offset N]\n"
    "                       [--kv-handoff on|off] [--kv-format NAME] [--kv-keep-ms N]\n"
    "                       [--step-interval-ms N]\n"
    "                       [--controller SOCKET --token T --role primary|standby\n"
    "                        --engine-id ID]\n"
    "  --model              model directory (config.json; safetensors when standalone)\n"
    "  --host, --port       HTTP address (default 127.0.0.1, port 0 = ephemeral)\n"
    "  --port-file          write the bound port there once serving (standalone) or\n"
    "                       listening (under a controller: a standby answers 503)\n"
    "  --kv-blocks          standalone KV cache blocks (default 1024)\n"
    "  --block-tokens       standalone tokens per KV block (default 16)\n"
    "  --threads            compute threads (default 1)\n"
    "  --max-batch          sequences per step (default 64)\n"
    "  --max-step-tokens    tokens per step, prefill chunks included (default 512)\n"
    "  --served-model-name  the model's name in the API (default: the --model folder's\n"
    "                       name, as the controller names the model in a fleet)\n"
    "  --engine-version     the version reported to the controller (default\n"
    "                       baton-refengine); shown by batonctl status during upgrades\n"
    "  --fail-percent       drill: answer P percent of completion requests with HTTP 500, as a\n"
    "                       broken build would (canary rollback drills); default 0\n"
    "  --seed-offset        drill: sample with each request's seed plus N, as a build whose\n"
    "                       sampling changed would (outputs differ); default 0\n"
    "  --kv-handoff         under a controller: leave a record of each sequence in its KV\n"
    "                       blocks, and on promotion continue the predecessor's sequences\n"
    "                       from theirs (KV-warm failover); default on\n"
    "  --kv-format          the KV format name in the records' identity (default\n"
    "                       baton-refengine-kv/1); engines of other names adopt nothing\n"
    "  --kv-keep-ms         how long adopted KV waits for its request to come back\n"
    "                       (default 30000)\n"
    "  --step-interval-ms   pace: a decoding step at most every N ms, so a stream gets one\n"
    "                       token per N ms, as from a far larger model (demos, drills: a\n"
    "                       stream of a small model lasts long enough to be killed in the\n"
    "                       middle); default 0, as fast as the model computes\n"
    "  --controller ...     run under baton-controller (values it fills in; missing ones\n"
    "                       are read from BATON_SOCKET, BATON_LAUNCH_TOKEN, BATON_ENGINE_ID)\n"
    "                       If the controller goes away the engine serves on and reattaches\n"
    "                       to the next one; BATON_ON_CONTROLLER_ABSENT=stop with\n"
    "                       BATON_CONTROLLER_ABSENT_TIMEOUT_MS=N makes it exit after N ms\n"
    "                       without one (default: serve on for as long as it takes)\n"
    "  BATON_ENGINE_KEYS    keys (comma-separated) of which every request but /health and\n"
    "                       /metrics must carry one as Authorization: Bearer KEY (401\n"
    "                       otherwise); the controller sets it from [engine] key_file\n";

std::string ParseRefEngineFlags(int argc, char** argv, RefEngineFlags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) return std::string(arg) + " needs a value";
    if (std::string error = ApplyFlag(arg, argv[++i], f); !error.empty()) return error;
  }
  if (f->model.empty()) return "--model DIR is required";
  // The model folder's name, as the controller's fleet record names the model (fleet.model):
  // a router that routes by that name finds an engine that answers to it.
  if (f->served_name.empty()) {
    const std::filesystem::path dir = std::filesystem::path(f->model).lexically_normal();
    f->served_name =
        dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
    if (f->served_name.empty()) f->served_name = f->model;
  }
  if (!f->role.empty() && !proto::ParseLaunchRole(f->role).ok()) {
    return "--role must be primary or standby";
  }
  return "";
}

Result<EngineLaunchInfo> RefEngineLaunchInfo(const RefEngineFlags& f) {
  EngineLaunchInfo info;
  if (f.token.empty() || f.engine_id.empty()) {
    BATON_ASSIGN_OR_RETURN(info, LaunchInfoFromEnv());
  }
  info.socket_path = f.controller;
  if (!f.token.empty()) info.launch_token = f.token;
  if (!f.role.empty()) info.role = f.role;
  if (!f.engine_id.empty() && !ParseNumber(std::string_view(f.engine_id), &info.engine_id)) {
    return InvalidArgument("--engine-id: not a number: " + f.engine_id);
  }
  return info;
}

}  // namespace baton
