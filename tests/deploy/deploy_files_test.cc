// What deploy/ ships, checked with the programs' own checks: each example configuration
// (deploy/config, as make install fills it in: build/deploy/config) passes
// `baton-controller --check-config` or `baton-router --check-config`; a broken one is refused
// with exit status 2 and the key named, and so is a model.dir a start could not load; every
// program answers --version; the systemd units have every placeholder filled in; and the docs
// quote the shipped files word for word.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "tests/chaos/chaos_harness.h"
#include "tests/deploy/deploy_support.h"

namespace baton::deploy_test {
namespace {

// The shipped fleet configurations name the engine key file where an install keeps it
// (<sysconfdir>/baton/engine.key), which the checks read: the copies checked here name a
// scratch key file instead, made once and removed when the test program ends.
class ScratchKeyFile {
 public:
  ScratchKeyFile() : dir_(ScratchDir("deploy-key")) {
    WriteFile(path(), "deploy-check-engine-key-0123456789\n");
    std::filesystem::permissions(
        path(), std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  ~ScratchKeyFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path() const { return dir_ + "/engine.key"; }
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
};

std::string Config(const std::string& name) {
  static const ScratchKeyFile key;
  const std::string shipped = BuildDir() + "/deploy/config/" + name;
  const std::string text = ReadFile(shipped);
  const std::regex key_file("\"[^\"]*/baton/engine\\.key\"");
  if (!std::regex_search(text, key_file)) return shipped;
  const std::string copy = key.dir() + "/" + name;
  WriteFile(copy, std::regex_replace(text, key_file, "\"" + key.path() + "\""));
  return copy;
}

// `baton-controller --check-config --config CONFIG --model MODEL`: the examples' model.dir
// (/var/lib/baton/models/...) is the operator's to fill in, a model that loads here by default.
ProgramRun CheckController(const std::string& config,
                           const std::string& model = chaos::TinyModelDir()) {
  return RunProgram(
      {BinDir() + "/baton-controller", "--check-config", "--config", config, "--model", model});
}
ProgramRun CheckRouter(const std::string& config) {
  return RunProgram({BinDir() + "/baton-router", "--check-config", "--config", config});
}

TEST(DeployFiles, ExampleConfigurationsPassTheProgramsChecks) {
  for (const char* name : {"controller.toml", "controller-fleet.toml"}) {
    const ProgramRun run = CheckController(Config(name));
    EXPECT_EQ(run.code, 0) << name << ":\n" << run.output;
    EXPECT_NE(run.output.find("the configuration is valid"), std::string::npos) << run.output;
    // A fleet node's check says where it registers; a node alone's says nothing of a fleet.
    EXPECT_EQ(run.output.find("\n  fleet       node ") != std::string::npos,
              std::string(name) == "controller-fleet.toml")
        << run.output;
    std::printf("%s\n%s", name, run.output.c_str());
  }
  for (const char* name : {"router.toml", "router-fleet.toml"}) {
    const ProgramRun run = CheckRouter(Config(name));
    EXPECT_EQ(run.code, 0) << name << ":\n" << run.output;
    EXPECT_NE(run.output.find("the configuration is valid"), std::string::npos) << run.output;
    std::printf("%s\n%s", name, run.output.c_str());
  }
}

// `[gpu] backend = "cuda"` where no CUDA driver loads: the check says the start would fail.
TEST(DeployFiles, TheCheckSaysWhenTheGpuBackendCannotStart) {
  const std::string path = Config("controller.toml");
  const std::string copy = ::testing::TempDir() + "baton-check-gpu.toml";
  WriteFile(copy, ReadFile(path) + "\n[gpu]\nbackend = \"cuda\"\n");
  const ProgramRun run = RunProgram({"/usr/bin/env", "BATON_CUDA_LIBRARY=/nonexistent/libcuda.so",
                                     BinDir() + "/baton-controller", "--check-config", "--config",
                                     copy, "--model", chaos::TinyModelDir()});
  EXPECT_EQ(run.code, 0) << run.output;  // valid, with a warning
  EXPECT_NE(run.output.find("warning: gpu: backend cuda was configured but cannot be used"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("the controller would not start"), std::string::npos) << run.output;
  std::filesystem::remove(copy);
}

// A model.dir a start could not load is refused as a start would refuse it (exit 2 here, as
// for a bad key; the start exits 1 with the same reason): one that is not there, one that is
// a file, one with no weights.
TEST(DeployFiles, TheCheckRefusesAModelDirAStartCouldNotLoad) {
  const std::string dir = ScratchDir("check-model");
  WriteFile(dir + "/a-file", "weights\n");
  WriteFile(dir + "/no-weights/config.json", "{}\n");
  const std::pair<std::string, std::string> cases[] = {
      {dir + "/nomodel", dir + "/nomodel: stat: No such file or directory"},
      {dir + "/a-file", dir + "/a-file: not a directory"},
      {dir + "/no-weights", dir + "/no-weights: no model.safetensors"},
  };
  for (const auto& [model, why] : cases) {
    const ProgramRun run = CheckController(Config("controller.toml"), model);
    EXPECT_EQ(run.code, 2) << model << ":\n" << run.output;
    EXPECT_NE(run.output.find("baton-controller: model.dir: " + why), std::string::npos)
        << run.output;
    EXPECT_NE(run.output.find("the controller would not start"), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("the configuration is valid"), std::string::npos) << run.output;
    std::printf("%s: exit %d: %s", model.c_str(), run.code, run.output.c_str());
  }
  std::filesystem::remove_all(dir);
}

// The weights load but engines would not start: config.json (which engines read) is missing,
// or is not JSON; the warning names the parse error, as the engine's exit would.
TEST(DeployFiles, TheCheckWarnsOfAModelConfigEnginesCannotRead) {
  const std::string dir = ScratchDir("check-model-config");
  std::filesystem::copy(chaos::TinyModelDir(), dir, std::filesystem::copy_options::recursive);
  WriteFile(dir + "/config.json", "{\"hidden_size\": 64,\n");
  ProgramRun run = CheckController(Config("controller.toml"), dir);
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("warning: model.dir's config.json is not valid JSON ("),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("parse error at line 2"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("no engine would start"), std::string::npos) << run.output;
  std::printf("%s", run.output.c_str());
  std::filesystem::remove(dir + "/config.json");
  run = CheckController(Config("controller.toml"), dir);
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("warning: model.dir has no readable config.json"), std::string::npos)
      << run.output;
  std::filesystem::remove_all(dir);
}

// A copy of `name` with `from` replaced by `to` (which must be in it).
std::string Broken(const std::string& name, const std::string& from, const std::string& to) {
  const std::string text = ReadFile(Config(name));
  EXPECT_NE(text.find(from), std::string::npos) << name << " has no " << from;
  char tmpl[] = "/tmp/baton-broken-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) != nullptr ? tmpl : "/tmp";
  const std::string path = dir + "/" + name;
  WriteFile(path, ReplaceAll(text, from, to));
  return path;
}

TEST(DeployFiles, BrokenConfigurationsAreRefusedWithExit2NamingTheKey) {
  struct Case {
    const char* file;
    const char* from;
    const char* to;
    const char* named;
  };
  const Case cases[] = {
      {"controller.toml", "block_bytes = \"2MiB\"", "block_bytes = 1000", "pool.block_bytes"},
      {"controller.toml", "base_port = 8101", "base_port = 70000", "engine.base_port"},
      {"controller.toml", "heartbeat_misses = 3", "heartbeat_misses = 3\nheartbeat_mises = 4",
       "health.heartbeat_mises"},
      {"controller.toml", "log_level = \"info\"", "log_level = \"loud\"", "controller.log_level"},
      {"controller-fleet.toml", "host = \"10.0.0.17\"", "host = \"\"", "engine.host"},
      {"router.toml", "max_queue_wait_ms = 5000", "max_queue_wait_ms = -5",
       "router.max_queue_wait_ms"},
      {"router.toml", "drain_timeout_ms = 30000", "drain_timeout_ms = \"soon\"",
       "router.drain_timeout_ms"},
      {"router-fleet.toml", "etcd_prefix = \"/baton/\"", "etcd_prefix = \"baton\"",
       "router.etcd_prefix"},
      {"controller-fleet.toml", "key_file = \"/", "key_file = \"/nonexistent/", "engine.key_file"},
      {"router-fleet.toml", "engine_key_file = \"/", "engine_key_file = \"relative/",
       "router.engine_key_file"},
  };
  for (const Case& c : cases) {
    const std::string path = Broken(c.file, c.from, c.to);
    const bool router = std::string(c.file).rfind("router", 0) == 0;
    const ProgramRun run = router ? CheckRouter(path) : CheckController(path);
    EXPECT_EQ(run.code, 2) << c.file << " with " << c.to << ":\n" << run.output;
    EXPECT_NE(run.output.find(c.named), std::string::npos)
        << c.file << " with " << c.to << " does not name " << c.named << ":\n"
        << run.output;
    std::printf("%s with `%s`: exit %d: %s", c.file, c.to, run.code, run.output.c_str());
    std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  }
}

TEST(DeployFiles, EveryProgramAnswersVersion) {
  for (const char* program : {"baton-controller", "baton-router", "batonctl", "baton-keeper",
                              "baton-refengine", "baton-weights", "baton-mkmodel"}) {
    const ProgramRun run = RunProgram({BinDir() + "/" + program, "--version"});
    EXPECT_EQ(run.code, 0) << program << ": " << run.output;
    EXPECT_TRUE(std::regex_search(
        run.output,
        std::regex("^" + std::string(program) + R"( \d+\.\d+\.\d+ \(commit \S+, \S+\)\n$)")))
        << program << ": " << run.output;
    std::printf("%s", run.output.c_str());
  }
  // The PyTorch engine says the same version
  // (python/baton-torch-engine/baton_torch_engine/__init__.py).
  const ProgramRun controller = RunProgram({BinDir() + "/baton-controller", "--version"});
  const std::string version = controller.output.substr(0, controller.output.find(" ("));
  const ProgramRun torch =
      RunProgram({SourceDir() + "/python/bin/baton-torch-engine", "--version"});
  EXPECT_EQ(torch.code, 0) << torch.output;
  EXPECT_EQ(torch.output, "baton-torch-engine " + version.substr(version.find(' ') + 1) + "\n");
  std::printf("%s", torch.output.c_str());
}

TEST(DeployFiles, UnitsHaveTheirPathsFilledIn) {
  for (const char* unit : {"baton-controller.service", "baton-router.service"}) {
    const std::string text = ReadFile(BuildDir() + "/deploy/systemd/" + unit);
    ASSERT_FALSE(text.empty()) << unit;
    EXPECT_EQ(text.find('@'), std::string::npos) << unit << " has a placeholder left:\n" << text;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(ExecStart=(\S+))"))) << text;
    EXPECT_EQ(std::filesystem::path(m[1].str()).filename().string(),
              std::string(unit).substr(0, std::string(unit).find('.')))
        << unit;
  }
  const std::string controller = ReadFile(BuildDir() + "/deploy/systemd/baton-controller.service");
  for (const char* line : {"Type=notify", "KillMode=process", "Delegate=yes",
                           "RestartPreventExitStatus=2", "WatchdogSignal=SIGKILL", "User=baton",
                           "RuntimeDirectory=baton", "StateDirectory=baton", "ExecReload="}) {
    EXPECT_NE(controller.find(std::string("\n") + line), std::string::npos) << line;
  }
  const std::string router = ReadFile(BuildDir() + "/deploy/systemd/baton-router.service");
  for (const char* line : {"Type=notify", "NotifyAccess=main", "WatchdogSec=",
                           "WatchdogSignal=SIGKILL", "RestartPreventExitStatus=2"}) {
    EXPECT_NE(router.find(std::string("\n") + line), std::string::npos) << line;
  }
}

// The router runs as a user of its own, and reaches the controller through the router socket:
// the controller's example makes it where the router's example looks, in the directory the
// tmpfiles file makes for the group baton-router (setgid), whose users the sysusers file
// creates.
TEST(DeployFiles, TheRouterRunsAsItsOwnUserThroughTheRouterSocket) {
  const std::string router = ReadFile(BuildDir() + "/deploy/systemd/baton-router.service");
  EXPECT_NE(router.find("\nUser=baton-router\nGroup=baton-router\n"), std::string::npos);
  const std::string socket = "/run/baton-routes/controller.sock";
  EXPECT_NE(ReadFile(Config("controller.toml")).find("\nrouter_socket = \"" + socket + "\""),
            std::string::npos);
  EXPECT_NE(ReadFile(Config("router.toml")).find("\ncontroller = \"" + socket + "\""),
            std::string::npos);
  EXPECT_NE(ReadFile(SourceDir() + "/deploy/tmpfiles/baton.conf")
                .find("\nd /run/baton-routes 2750 baton baton-router -\n"),
            std::string::npos);
  const std::string users = ReadFile(SourceDir() + "/deploy/sysusers/baton.conf");
  EXPECT_NE(users.find("\nu baton "), std::string::npos) << users;
  EXPECT_NE(users.find("\nu baton-router "), std::string::npos) << users;
}

// The router is sandboxed tightly. The controller's sandbox holds its engines too: nothing
// in it may close the GPU's device nodes, setuid nvidia-modprobe, JIT code, or give the
// unit a /tmp that a controller restart would take from the engines it leaves running.
TEST(DeployFiles, UnitsAreSandboxedAsFarAsTheirEnginesAllow) {
  const std::string router = ReadFile(BuildDir() + "/deploy/systemd/baton-router.service");
  for (const char* line :
       {"NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateDevices=yes", "PrivateTmp=yes",
        "MemoryDenyWriteExecute=yes", "CapabilityBoundingSet=\n"}) {
    EXPECT_NE(router.find(std::string("\n") + line), std::string::npos) << line;
  }
  const std::string controller = ReadFile(BuildDir() + "/deploy/systemd/baton-controller.service");
  for (const char* line : {"ProtectSystem=full", "ProtectHome=read-only"}) {
    EXPECT_NE(controller.find(std::string("\n") + line), std::string::npos) << line;
  }
  // Each of these closes /dev/nvidia* or filters system calls, which makes a service that is
  // not root NoNewPrivileges (no setuid nvidia-modprobe); RestrictNamespaces also refuses
  // clone3 (engines made in their cgroups).
  for (const char* key : {"NoNewPrivileges=",
                          "PrivateDevices=",
                          "DevicePolicy=",
                          "DeviceAllow=",
                          "ProtectClock=",
                          "ProtectKernelModules=",
                          "ProtectKernelTunables=",
                          "ProtectKernelLogs=",
                          "ProtectHostname=",
                          "MemoryDenyWriteExecute=",
                          "PrivateTmp=",
                          "SystemCallFilter=",
                          "SystemCallArchitectures=",
                          "RestrictNamespaces=",
                          "RestrictRealtime=",
                          "RestrictSUIDSGID=",
                          "RestrictAddressFamilies=",
                          "LockPersonality=",
                          "DynamicUser=",
                          "CapabilityBoundingSet="}) {
    EXPECT_EQ(controller.find(std::string("\n") + key), std::string::npos)
        << key << " would break GPU engines or engines left across a restart";
  }
}

// Docs quote a shipped file after a line `<!-- quote: PATH -->` as a fenced block that must
// be PATH word for word; a unit written into a doc any other way is a diverging snippet.
TEST(DeployFiles, DocsQuoteTheShippedFilesWordForWord) {
  int quotes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(SourceDir() + "/docs")) {
    const std::string doc = entry.path().filename().string();
    const std::string text = ReadFile(entry.path().string());
    const std::regex quote(R"(<!-- quote: (\S+) -->\n```[a-z]*\n([\s\S]*?)```)");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), quote);
         it != std::sregex_iterator(); ++it) {
      const std::string file = (*it)[1];
      EXPECT_EQ((*it)[2].str(), ReadFile(SourceDir() + "/" + file))
          << doc << " quotes " << file << " differently from the file";
      ++quotes;
    }
    const std::string unquoted = std::regex_replace(text, quote, "");
    EXPECT_EQ(unquoted.find("\n[Service]"), std::string::npos)
        << doc << " has a systemd unit that is not a quote of deploy/systemd";
  }
  EXPECT_GE(quotes, 2) << "docs/operations.md quotes the controller's and the router's units";
}

}  // namespace
}  // namespace baton::deploy_test
