// baton-refengine's command line: its flags, its usage text, and the launch fields the
// flags leave to the controller's environment. Plain values and functions; thread-compatible.
#pragma once

#include <string>

#include "base/status.h"
#include "standby/sdk/engine_sdk.h"

namespace baton {

struct RefEngineFlags {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string port_file;
  int kv_blocks = 1024;
  int block_tokens = 16;
  int threads = 1;
  int max_batch = 64;
  int max_step_tokens = 512;
  std::string served_name;
  std::string controller;
  std::string token;
  std::string role;
  std::string engine_id;
  std::string engine_version = "baton-refengine";
  int fail_percent = 0;
  int seed_offset = 0;
  bool kv_handoff = true;
  std::string kv_format = "baton-refengine-kv/1";
  int kv_keep_ms = 30000;
  int step_interval_ms = 0;
};

extern const char kRefEngineUsage[];

// Parses argv (after argv[0]) into `f`; an error message naming the flag, or "" (the served
// model name defaults to the model folder's name).
std::string ParseRefEngineFlags(int argc, char** argv, RefEngineFlags* f);

// The launch fields under a controller: the flags', and what they leave out from the
// controller's environment (LaunchInfoFromEnv).
Result<EngineLaunchInfo> RefEngineLaunchInfo(const RefEngineFlags& f);

}  // namespace baton
