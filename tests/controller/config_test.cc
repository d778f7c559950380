#include "controller/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <tuple>

namespace baton {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kFull[] = R"(
[controller]
runtime_dir = "/tmp/baton-test-run"
state_dir = "/tmp/baton-test-state"
epoch_reserve = 8
log_level = "debug"
metrics_port = 9100
metrics_host = "0.0.0.0"
name = "ctl-a"

[model]
dir = "/models/tiny"
numa_node = 1
huge_pages = false
lock = false

[engine]
command = ["build/bin/baton-refengine", "--socket", "{socket}", "--port", "{port}"]
log_dir = "/tmp/baton-test-logs"
log_keep = 3
crash_log_keep = 5
cgroup = "off"
base_port = 8101
port_count = 2
register_timeout_ms = 30000
promote_timeout_ms = 2000
drain_timeout_ms = 7000
stop_grace_ms = 500

[pool]
blocks = 512
block_bytes = "2MiB"
huge_pages = false
initial_grant_blocks = 64

[health]
heartbeat_interval_ms = 50
heartbeat_misses = 4
probe_timeout_ms = 80
compute_stall_timeout_ms = 45000

[policy]
max_failures = 7
failure_window_s = 30
initial_backoff_ms = 500
max_backoff_ms = 8000
quiet_period_s = 90
standby_relaunch_delay_ms = 250

[upgrade]
steps = [5, 25, 100]
step_duration_ms = 60000
min_requests = 50
max_error_rate_excess = 0.02
max_latency_ratio = 1.5
latency_warmup_requests = 25
max_disagreement_rate = 0.01

[gpu]
pool_chunk_bytes = "64MiB"
)";

TEST(Config, ParsesEveryKey) {
  Result<ControllerConfig> c = ParseConfigToml(kFull, "full.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->runtime_dir, "/tmp/baton-test-run");
  EXPECT_EQ(c->state_dir, "/tmp/baton-test-state");
  EXPECT_EQ(c->epoch_reserve, 8u);
  EXPECT_EQ(c->log_level, "debug");
  EXPECT_EQ(c->metrics_port, 9100);
  EXPECT_EQ(c->metrics_host, "0.0.0.0");
  EXPECT_EQ(c->name, "ctl-a");
  EXPECT_EQ(c->model_dir, "/models/tiny");
  EXPECT_EQ(c->numa_node, 1);
  EXPECT_FALSE(c->weights_huge_pages);
  EXPECT_FALSE(c->weights_lock);
  ASSERT_EQ(c->engine_command.size(), 5u);
  EXPECT_EQ(c->engine_command[2], "{socket}");
  EXPECT_EQ(c->engine_log_dir, "/tmp/baton-test-logs");
  EXPECT_EQ(c->engine_log_keep, 3);
  EXPECT_EQ(c->engine_crash_log_keep, 5);
  EXPECT_EQ(c->engine_cgroup, "off");
  EXPECT_EQ(c->base_port, 8101);
  EXPECT_EQ(c->port_count, 2);
  EXPECT_EQ(c->register_timeout, seconds(30));
  EXPECT_EQ(c->promote_timeout, seconds(2));
  EXPECT_EQ(c->drain_timeout, seconds(7));
  EXPECT_EQ(c->stop_grace, milliseconds(500));
  EXPECT_EQ(c->block_count, 512u);
  EXPECT_EQ(c->block_bytes, 2u << 20);
  EXPECT_FALSE(c->pool_huge_pages);
  EXPECT_EQ(c->initial_grant_blocks, 64u);
  EXPECT_EQ(c->gpu_pool_chunk_bytes, 64u << 20);
  EXPECT_EQ(c->heartbeat_interval, milliseconds(50));
  EXPECT_EQ(c->heartbeat_misses, 4);
  EXPECT_EQ(c->probe_timeout, milliseconds(80));
  EXPECT_EQ(c->compute_stall_timeout, seconds(45));
  EXPECT_EQ(c->crash.max_failures, 7);
  EXPECT_EQ(c->crash.window, seconds(30));
  EXPECT_EQ(c->crash.initial_backoff, milliseconds(500));
  EXPECT_EQ(c->crash.max_backoff, seconds(8));
  EXPECT_EQ(c->crash.quiet_period, seconds(90));
  EXPECT_EQ(c->standby_relaunch_delay, milliseconds(250));
  EXPECT_EQ(c->canary.steps, (std::vector<uint32_t>{5, 25, 100}));
  EXPECT_EQ(c->canary.step_duration, seconds(60));
  EXPECT_EQ(c->canary.min_requests, 50u);
  EXPECT_DOUBLE_EQ(c->canary.max_error_rate_excess, 0.02);
  EXPECT_DOUBLE_EQ(c->canary.max_latency_ratio, 1.5);
  EXPECT_EQ(c->canary.latency_warmup_requests, 25u);
  EXPECT_DOUBLE_EQ(c->canary.max_disagreement_rate, 0.01);
  ControllerConfig done = *c;
  EXPECT_TRUE(FinishConfig(&done).ok());
}

TEST(Config, DefaultsMatchTheDesign) {
  Result<ControllerConfig> c = ParseConfigToml("", "empty.toml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->heartbeat_interval, milliseconds(100));
  EXPECT_EQ(c->heartbeat_misses, 3);
  EXPECT_EQ(c->compute_stall_timeout, seconds(30));
  EXPECT_EQ(c->block_bytes, 2u << 20);
  EXPECT_TRUE(c->pool_huge_pages);
  EXPECT_TRUE(c->weights_huge_pages);
  EXPECT_EQ(c->standby_relaunch_delay, milliseconds(100));
  EXPECT_EQ(c->canary.steps, (std::vector<uint32_t>{10, 50, 100}));
  EXPECT_EQ(c->canary.step_duration, seconds(30));
  EXPECT_EQ(c->canary.min_requests, 20u);
  EXPECT_EQ(c->gpu_pool_chunk_bytes, 256u << 20);
}

// Each bad config is refused with an error that names the key and the rule.
TEST(Config, BadConfigsAreRefusedWithTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"[pool]\nblocks = \"many\"\n", "pool.blocks: expected an integer"},
      {"[pool]\nblok_bytes = 4096\n", "unknown key 'pool.blok_bytes'"},
      {"[pool]\nblock_bytes = \"2 parsecs\"\n", "pool.block_bytes: not a size"},
      // 99999999999 GiB wraps a 64-bit byte count: refused, not taken modulo 2^64.
      {"[pool]\nblock_bytes = \"99999999999GiB\"\n", "pool.block_bytes: size too large"},
      {"[pool]\nblocks = 99999999999999999999\n",
       "pool.blocks: must be in [1, 16777216], got a number at or past the 64-bit limit"},
      {"[pool]\nblock_bytes = 2251799813685249\n", "pool.block_bytes: size too large"},
      {"[health]\nheartbeat_misses = 0\n", "health.heartbeat_misses: must be in [1, 1000]"},
      {"[engine]\ncommand = [\"a\", 3]\n", "engine.command: expected a string"},
      {"[engine]\ncommand = \"a 'b\"\n", "unterminated quote"},
      {"[model]\nhuge_pages = \"yes\"\n", "model.huge_pages: expected true or false"},
      {"pool = 3\n", "'pool' must be a [section]"},
      {"[pool\nblocks = 1\n", "malformed TOML"},
      // Parsed by recursion: deeper text would overflow the stack (SIGSEGV) before an error.
      // The values of a [table] count from its depth.
      {"[engine]\ncommand = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
       "bad.toml: arrays, tables and dotted keys nested 35 deep (at most 32)"},
      // toml11 builds and copies a dotted key's tables by recursion too.
      {"[engine]\nx.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x.x = 1\n",
       "bad.toml: arrays, tables and dotted keys nested 33 deep (at most 32)"},
      {"[controller]\nmetrics_port = 70000\n", "controller.metrics_port: must be in [0, 65535]"},
      {"[controller]\nepoch_reserve = 0\n", "controller.epoch_reserve: must be in [1, 1048576]"},
      {"[upgrade]\nsteps = [10, 50]\n", "upgrade.steps: canary steps: the last step must be 100"},
      {"[upgrade]\nsteps = [50, 10, 100]\n", "upgrade.steps: canary steps: must rise strictly"},
      {"[upgrade]\nmax_error_rate_excess = 2.0\n", "upgrade.max_error_rate_excess: must be in"},
      {"[upgrade]\nmax_latency_ratio = \"fast\"\n", "upgrade.max_latency_ratio: expected a number"},
  };
  for (const auto& [text, want] : cases) {
    Result<ControllerConfig> c = ParseConfigToml(text, "bad.toml");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(want), std::string::npos)
        << "for:\n"
        << text << "got: " << c.status().message();
  }
}

TEST(Config, FinishConfigChecksRequiredKeysAndRules) {
  ControllerConfig c;
  Status s = FinishConfig(&c);
  EXPECT_NE(s.message().find("model.dir"), std::string::npos) << s.ToString();
  c.model_dir = "/m";
  s = FinishConfig(&c);
  EXPECT_NE(s.message().find("engine.command"), std::string::npos) << s.ToString();
  c.engine_command = {"/bin/true", "--name", "caf\xE9"};
  s = FinishConfig(&c);
  EXPECT_NE(s.message().find("not valid UTF-8"), std::string::npos) << s.ToString();
  // A {name} the controller does not fill in reaches the engine as written (a warning at
  // start and from --check-config, not a refusal: an awk script's {print} may be meant).
  c.engine_command = {"/bin/true", "--port", "{bogus}"};
  EXPECT_TRUE(FinishConfig(&c).ok());
  c.engine_command = {"/bin/true"};
  c.block_bytes = 1000;
  s = FinishConfig(&c);
  EXPECT_NE(s.message().find("multiple of 4096"), std::string::npos) << s.ToString();
  c.block_bytes = 4096;
  c.gpu_pool_chunk_bytes = 0;
  s = FinishConfig(&c);
  EXPECT_NE(s.message().find("gpu.pool_chunk_bytes"), std::string::npos) << s.ToString();
  c.gpu_pool_chunk_bytes = 64u << 20;
  c.base_port = 65535;
  c.port_count = 10;  // standbys would be launched on port 65536 and exit
  s = FinishConfig(&c);
  EXPECT_NE(s.message().find("engine.base_port 65535 + port_count 10 runs past port 65535"),
            std::string::npos)
      << s.ToString();
  c.port_count = 1;
  ASSERT_TRUE(FinishConfig(&c).ok());
  EXPECT_FALSE(c.runtime_dir.empty());
  EXPECT_EQ(c.state_dir, c.runtime_dir + "/state");
  EXPECT_EQ(c.socket_path(), c.runtime_dir + "/controller.sock");
}

// engine.host ({host}), the address engines listen on and announce, and the engine logs'
// bounds.
TEST(Config, EngineHostAndLogBounds) {
  ControllerConfig d;
  EXPECT_EQ(d.engine_host, "127.0.0.1");
  EXPECT_EQ(d.engine_log_max_bytes, 64ull << 20);
  EXPECT_EQ(d.engine_log_keep, 8);
  Result<ControllerConfig> c = ParseConfigToml(
      "[engine]\nhost = \"10.0.0.7\"\nlog_max_bytes = \"1MiB\"\nlog_keep = 3\n", "t.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->engine_host, "10.0.0.7");
  EXPECT_EQ(c->engine_log_max_bytes, 1u << 20);
  EXPECT_EQ(c->engine_log_keep, 3);
  c = ParseConfigToml("[engine]\nlog_max_bytes = 0\n", "t.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->engine_log_max_bytes, 0u);  // never rotated
  c = ParseConfigToml("[engine]\nlog_keep = 0\n", "t.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("engine.log_keep"), std::string::npos);

  ControllerConfig f;
  f.model_dir = "/m";
  f.engine_command = {"/bin/true"};
  for (const char* bad : {"", "10.0.0.7 8000", "http://10.0.0.7"}) {
    f.engine_host = bad;
    const Status s = FinishConfig(&f);
    EXPECT_NE(s.message().find("engine.host"), std::string::npos) << bad << ": " << s.ToString();
  }
  f.engine_host = "node-a.example";
  EXPECT_TRUE(FinishConfig(&f).ok());
}

// What a start would refuse only once there (exit 1, restarted in a loop by systemd) is refused
// with the config, naming the key (exit 2, --check-config too).
TEST(Config, SettingsAStartWouldRefuseAreRefusedWithTheConfig) {
  ControllerConfig f;
  f.model_dir = "/m";
  f.engine_command = {"/bin/true"};
  f.metrics_host = "localhost";  // bound as an address, not resolved
  EXPECT_TRUE(FinishConfig(&f).ok()) << "no metrics_port: nothing is bound";
  f.metrics_port = 9464;
  EXPECT_EQ(FinishConfig(&f).message(),
            "controller.metrics_host: want an IP address, got \"localhost\"");
  for (const char* good : {"127.0.0.1", "0.0.0.0", "::1", "::"}) {
    f.metrics_host = good;
    EXPECT_TRUE(FinishConfig(&f).ok()) << good;
  }
  for (const char* bad : {"", "baton/engines", "sys/fs/cgroup/baton"}) {
    f.engine_cgroup = bad;
    EXPECT_EQ(FinishConfig(&f).message(),
              std::string("engine.cgroup: want \"auto\", \"off\" or an absolute path, got \"") +
                  bad + "\"");
  }
  for (const char* good : {"auto", "off", "/sys/fs/cgroup/baton"}) {
    f.engine_cgroup = good;
    EXPECT_TRUE(FinishConfig(&f).ok()) << good;
  }
}

TEST(Config, TheRouterSocketIsAnotherAbsolutePath) {
  Result<ControllerConfig> c = ParseConfigToml(
      "[controller]\nrouter_socket = \"/run/baton-routes/controller.sock\"\n", "t.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->router_socket, "/run/baton-routes/controller.sock");
  ControllerConfig f;
  f.model_dir = "/m";
  f.engine_command = {"/bin/true"};
  f.runtime_dir = "/run/baton";
  EXPECT_TRUE(FinishConfig(&f).ok()) << "none by default";
  for (const std::string& bad : std::vector<std::string>{
           "routes.sock", "/run/baton/controller.sock", "/run/baton/keeper.sock",
           "/run/baton//./controller.sock", "/" + std::string(107, 'x')}) {
    f.router_socket = bad;
    const Status s = FinishConfig(&f);
    EXPECT_NE(s.message().find("controller.router_socket"), std::string::npos)
        << bad << ": " << s.ToString();
  }
}

// engine.key_file: an absolute path to a key file a start could read.
TEST(Config, TheEngineKeyFileIsReadWhenTheConfigIsFinished) {
  Result<ControllerConfig> c =
      ParseConfigToml("[engine]\nkey_file = \"/etc/baton/engine.key\"\n", "t.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->engine_key_file, "/etc/baton/engine.key");
  const std::string dir = ::testing::TempDir() + "baton-config-key-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string key = dir + "/engine.key";
  std::ofstream(key) << "config-test-engine-key-0123456789\n";
  ControllerConfig f;
  f.model_dir = "/m";
  f.engine_command = {"/bin/true"};
  f.runtime_dir = "/run/baton";
  for (const auto& [path, mode, named] : std::vector<std::tuple<std::string, int, std::string>>{
           {"engine.key", 0600, "want an absolute path"},
           {dir + "/none.key", 0600, "No such file or directory"},
           {key, 0644, "open to every user (mode 0644)"},
           {key, 0600, ""}}) {
    ::chmod(key.c_str(), static_cast<mode_t>(mode));
    f.engine_key_file = path;
    const Status s = FinishConfig(&f);
    if (named.empty()) {
      EXPECT_TRUE(s.ok()) << s.ToString();
    } else {
      EXPECT_NE(s.message().find("engine.key_file: "), std::string::npos) << s.ToString();
      EXPECT_NE(s.message().find(named), std::string::npos) << s.ToString();
    }
  }
  std::filesystem::remove_all(dir);
}

// A value the file got wrong is named with the file, as every key's is.
TEST(Config, AnUnknownGpuBackendNamesTheFile) {
  const std::string base =
      "[model]\ndir = \"/models/m\"\n[engine]\ncommand = [\"/bin/true\"]\n[gpu]\n";
  Result<ControllerConfig> bad = ParseConfigToml(base + "backend = \"gpu\"\n", "c.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "c.toml: gpu.backend: backend must be auto, host or cuda, got 'gpu'");
  EXPECT_TRUE(ParseConfigToml(base + "backend = \"host\"\n", "c.toml").ok());
}

TEST(Config, RuntimeDirComesFromTheEnvironment) {
  ::setenv("BATON_RUNTIME_DIR", "/tmp/baton-env-dir", 1);
  EXPECT_EQ(DefaultRuntimeDir(), "/tmp/baton-env-dir");
  ::unsetenv("BATON_RUNTIME_DIR");
  EXPECT_EQ(DefaultRuntimeDir(), "/tmp/baton-" + std::to_string(::getuid()));
}

TEST(Config, FlagsOverrideTheFile) {
  const std::string path = "/tmp/baton-config-test-" + std::to_string(::getpid()) + ".toml";
  {
    std::ofstream out(path);
    out << "[model]\ndir = \"/from/file\"\n[pool]\nblocks = 10\n";
  }
  std::vector<std::string> args = {"baton-controller",
                                   "--config",
                                   path,
                                   "--pool-blocks",
                                   "20",
                                   "--engine-cmd",
                                   "eng --socket {socket} --name 'a b'",
                                   "--health.heartbeat_interval_ms=25",
                                   "--upgrade.steps=20,100",
                                   "--upgrade.max_error_rate_excess=0.1",
                                   "--controller.name=42",
                                   "--no-huge-pages"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ControllerConfig c;
  Status s = ParseControllerFlags(static_cast<int>(argv.size()), argv.data(), &c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.model_dir, "/from/file");
  EXPECT_EQ(c.block_count, 20u);
  EXPECT_EQ(c.heartbeat_interval, milliseconds(25));
  EXPECT_FALSE(c.pool_huge_pages);
  EXPECT_FALSE(c.weights_huge_pages);
  ASSERT_EQ(c.engine_command.size(), 5u);
  EXPECT_EQ(c.engine_command[4], "a b");
  EXPECT_EQ(c.canary.steps, (std::vector<uint32_t>{20, 100}));
  EXPECT_DOUBLE_EQ(c.canary.max_error_rate_excess, 0.1);
  EXPECT_EQ(c.name, "42") << "a string key takes a value that reads as a number";
  std::remove(path.c_str());
}

// ParseControllerFlags on `args` (argv[0] first) into a default config.
Status ParseFlags(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ControllerConfig c;
  return ParseControllerFlags(static_cast<int>(argv.size()), argv.data(), &c);
}

TEST(Config, BadFlagsAreRefused) {
  EXPECT_NE(ParseFlags({"x", "--frobnicate", "1"}).message().find("unknown flag --frobnicate"),
            std::string::npos);
  EXPECT_NE(ParseFlags({"x", "--pool-blocks", "-3"}).message().find("--pool-blocks"),
            std::string::npos);
  EXPECT_NE(ParseFlags({"x", "--config", "/nonexistent.toml"}).message().find("/nonexistent.toml"),
            std::string::npos);
  // An ifstream opens a directory and reads it as an empty config: refused (batonctl --config
  // reads the file with LoadConfigFile too).
  EXPECT_EQ(ParseFlags({"x", "--config", "/"}).message(), "config file /: is a directory");
  EXPECT_EQ(ParseFlags({"x", "--config", "/"}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseFlags({"x", "--config", "/dev/null"}).message(),
            "config file /dev/null: not a regular file");
  EXPECT_EQ(ParseFlags({"x", "--help"}).code(), StatusCode::kNotFound);
  EXPECT_FALSE(ParseFlags({"x", "--health.heartbeat_interval_ms=soon"}).ok())
      << "a number key still refuses text";
}

// A mistyped flag is unknown whatever follows it: nothing, a value, or another flag (not "needs
// a value", which would send the operator looking for a value to give it).
TEST(Config, AnUnknownFlagIsNamedUnknownWhateverFollowsIt) {
  const auto parse = [](std::vector<std::string> args) { return ParseFlags(args).message(); };
  EXPECT_EQ(parse({"x", "--no-huge-pagez"}), "unknown flag --no-huge-pagez (see --help)");
  EXPECT_EQ(parse({"x", "--bogus"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(parse({"x", "--bogus", "--pool-blocks", "8"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(parse({"x", "--bogus-flag=1"}), "unknown flag --bogus-flag (see --help)");
  EXPECT_EQ(parse({"x", "--pool.blockz", "8"}), "unknown flag --pool.blockz (see --help)");
  EXPECT_EQ(parse({"x", "--pool-blocks"}), "--pool-blocks needs a value");
  EXPECT_EQ(parse({"x", "--model.huge_pages"}), "--model.huge_pages needs a value");
  // A known flag given a value it does not take is no unknown flag.
  EXPECT_EQ(parse({"x", "--no-huge-pages=false"}), "--no-huge-pages takes no value");
}

// A value a flag refuses is quoted back with the flag, so that the operator sees what the
// shell passed.
TEST(Config, ABadFlagValueNamesTheFlagAndTheValue) {
  const auto parse = [](std::vector<std::string> args) { return ParseFlags(args).message(); };
  EXPECT_EQ(parse({"x", "--pool-blocks", "abc"}),
            "--pool-blocks: expected an integer, got \"abc\"");
  EXPECT_EQ(parse({"x", "--pool-blocks=1.5"}), "--pool-blocks: expected an integer, got \"1.5\"");
  EXPECT_EQ(parse({"x", "--model.huge_pages", "yes"}),
            "--model.huge_pages: expected true or false, got \"yes\"");
  EXPECT_EQ(parse({"x", "--model.huge_pages", "1"}),
            "--model.huge_pages: expected true or false, got 1");
  EXPECT_EQ(parse({"x", "--pool-blocks", "-3"}), "--pool-blocks: must be in [1, 16777216], got -3");
  // The same words for a file's value.
  EXPECT_EQ(ParseConfigToml("[pool]\nblocks = [1, 2]\n", "c.toml").status().message(),
            "c.toml: pool.blocks: expected an integer, got an array");
  EXPECT_EQ(ParseConfigToml("[pool]\nblocks = \"many\"\n", "c.toml").status().message(),
            "c.toml: pool.blocks: expected an integer, got \"many\"");
}

TEST(Config, SplitCommandLine) {
  Result<std::vector<std::string>> parts = SplitCommandLine("  a  'b c' \"d'e\" f\"g h\" ");
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(*parts, (std::vector<std::string>{"a", "b c", "d'e", "fg h"}));
  EXPECT_FALSE(SplitCommandLine("   ").ok());
}

}  // namespace
}  // namespace baton
