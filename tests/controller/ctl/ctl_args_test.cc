// batonctl's usage errors name the real problem (CheckCtlArgs, ParseUpgradeArgs,
// ParseRollbackArgs), a rollback's canary options are refused where they cannot apply
// (CheckRollbackOptions), and the batonctl binary prints a usage error as one line and a hint
// (the whole usage only for --help or no command), --json objects last, --json --version too;
// it connects through no runtime directory another user made or may write to.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/ctl/ctl_service.h"
#include "controller/upgrade/ctl_upgrade.h"

namespace baton {
namespace {

using nlohmann::json;

std::string Error(const Status& s) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  return s.message();
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CtlArgs, AWordWhereAnOptionIsExpectedIsAnUnexpectedArgument) {
  const std::string upgrade = Error(ParseUpgradeArgs({"foo"}).status());
  EXPECT_TRUE(Has(upgrade, "unexpected argument 'foo'")) << upgrade;
  EXPECT_TRUE(Has(upgrade, "after --")) << upgrade;
  EXPECT_FALSE(Has(upgrade, "needs a value")) << upgrade;
  const std::string two = Error(ParseUpgradeArgs({"foo", "bar"}).status());
  EXPECT_TRUE(Has(two, "unexpected argument 'foo'")) << two;
  EXPECT_FALSE(Has(two, "unknown option")) << two;
  const std::string rollback = Error(ParseRollbackArgs({"extra"}).status());
  EXPECT_TRUE(Has(rollback, "unexpected argument 'extra'")) << rollback;
  EXPECT_FALSE(Has(rollback, "needs a value")) << rollback;
}

TEST(CtlArgs, OptionsAreCheckedByNameBeforeTheirValue) {
  EXPECT_EQ(Error(ParseUpgradeArgs({"--bogus"}).status()), "unknown option '--bogus' for upgrade");
  EXPECT_EQ(Error(ParseRollbackArgs({"--bogus", "1"}).status()),
            "unknown option '--bogus' for rollback");
  EXPECT_EQ(Error(ParseRollbackArgs({"--steps"}).status()), "--steps needs a value");
  ASSERT_TRUE(ParseRollbackArgs({"--steps", "10,100", "--step-ms", "5"}).ok());
  ASSERT_TRUE(ParseUpgradeArgs({"--step-ms", "5", "--", "engine", "--flag"}).ok());
}

TEST(CtlArgs, ExtraArgumentsAreNamed) {
  EXPECT_EQ(Error(CheckCtlArgs("drill", {"kill", "extra"})),
            "drill kill takes no further arguments: unexpected argument 'extra'");
  EXPECT_EQ(Error(CheckCtlArgs("controller", {"restart", "now"})),
            "controller restart takes no further arguments: unexpected argument 'now'");
  EXPECT_EQ(Error(CheckCtlArgs("status", {"x"})),
            "status takes no arguments: unexpected argument 'x'");
  EXPECT_EQ(Error(CheckCtlArgs("drill", {})), "drill needs one of: kill, hang, error");
  EXPECT_TRUE(Has(Error(CheckCtlArgs("drill", {"explode"})), "unknown drill 'explode'"));
  EXPECT_TRUE(Has(Error(CheckCtlArgs("controller", {"stop"})), "unknown controller command"));
  EXPECT_TRUE(Has(Error(CheckCtlArgs("frobnicate", {})), "unknown command 'frobnicate'"));
  EXPECT_TRUE(CheckCtlArgs("drill", {"hang"}).ok());
  EXPECT_TRUE(CheckCtlArgs("controller", {"restart"}).ok());
  EXPECT_TRUE(CheckCtlArgs("timeline", {}).ok());
}

// The canary options shape only a rollback that upgrades back to the previous command.
TEST(CtlArgs, RollbackOptionsAreRefusedWhileAnUpgradeRuns) {
  const UpgradeRequest options = *ParseRollbackArgs({"--steps", "10,100", "--step-ms", "5"});
  const Status refused = CheckRollbackOptions(options, /*upgrade_running=*/true);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_TRUE(Has(refused.message(), "without them")) << refused.message();
  EXPECT_TRUE(CheckRollbackOptions(options, /*upgrade_running=*/false).ok());
  EXPECT_TRUE(CheckRollbackOptions(UpgradeRequest{}, /*upgrade_running=*/true).ok());
}

struct CtlRun {
  int exit_code = -1;
  std::string out;
};

// build/bin/batonctl with `args` (no controller is reached: usage is checked first).
CtlRun Batonctl(const std::string& args, const std::string& redirect) {
  const std::string cmd = std::string(BATON_BIN_DIR) + "/batonctl " + args + " " + redirect;
  CtlRun r;
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) r.out += buf;
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(text.substr(start, nl - start));
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

TEST(BatonctlUsage, AUsageErrorIsOneLineAndAHint) {
  for (const char* args :
       {"upgrade foo", "rollback extra", "drill kill extra", "controller restart now", "frobnicate",
        "--socket", "-j status", "status -- foo"}) {
    const CtlRun r = Batonctl(args, "2>&1 >/dev/null");
    EXPECT_EQ(r.exit_code, 2) << args;
    const std::vector<std::string> lines = Lines(r.out);
    ASSERT_EQ(lines.size(), 2u) << args << ":\n" << r.out;
    EXPECT_EQ(lines[0].rfind("batonctl: ", 0), 0u) << lines[0];
    EXPECT_EQ(lines[1], CtlUsageHint());
  }
}

// A short option is an option, and a config file that does not parse is named on one line,
// with where, not with the parser's drawing of the line.
TEST(BatonctlUsage, OptionsAndConfigErrorsAreNamedOnOneLine) {
  EXPECT_TRUE(Has(Batonctl("-j status", "2>&1").out, "batonctl: unknown option '-j'"));
  EXPECT_TRUE(Has(Batonctl("status -- foo", "2>&1").out, "'--' comes before an engine command"));
  char path[] = "/tmp/baton-ctl-config-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = "root:x:0:0\n";
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  const CtlRun r = Batonctl(std::string("--config ") + path + " status", "2>&1 >/dev/null");
  ::unlink(path);
  EXPECT_EQ(r.exit_code, 2);
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_TRUE(Has(lines[0], "batonctl: --config: malformed TOML: ")) << lines[0];
  EXPECT_TRUE(Has(lines[0], std::string(" (at ") + path + ":1)")) << lines[0];
}

TEST(BatonctlUsage, TheWholeUsageOnlyForHelpOrNoCommand) {
  const CtlRun help = Batonctl("--help", "2>/dev/null");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.out, CtlUsage());
  const CtlRun none = Batonctl("", "2>&1");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_TRUE(Has(none.out, "no command given")) << none.out;
  EXPECT_TRUE(Has(none.out, CtlUsage())) << none.out;
}

TEST(BatonctlUsage, WithJsonTheErrorObjectComesLast) {
  const CtlRun r = Batonctl("--json drill kill extra", "2>/dev/null");
  EXPECT_EQ(r.exit_code, 2);
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const json j = json::parse(lines.back(), nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["ok"], false);
  EXPECT_TRUE(Has(j["error"].get<std::string>(), "unexpected argument 'extra'")) << j.dump();
}

TEST(BatonctlUsage, JsonVersionIsOneObject) {
  const CtlRun r = Batonctl("--json --version", "2>/dev/null");
  EXPECT_EQ(r.exit_code, 0);
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const json j = json::parse(lines[0], nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["program"], "batonctl");
  EXPECT_FALSE(j["version"].get<std::string>().empty());
  const CtlRun text = Batonctl("--version", "2>/dev/null");
  EXPECT_EQ(text.out.rfind("batonctl ", 0), 0u) << text.out;
}

// A socket in a directory another user made (or may write to) may be theirs: batonctl exits 1
// naming the directory before it connects (base/io/private_dir.h).
TEST(BatonctlRuntimeDir, AForeignOrWritableDirectoryIsRefusedBeforeConnecting) {
  char tmpl[] = "/tmp/baton-ctl-run-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  struct Removed {  // on every exit path, a failed ASSERT's too
    std::string dir;
    ~Removed() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } removed{dir};
  const std::string args = "--socket " + dir + "/controller.sock status";
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  const CtlRun writable = Batonctl(args, "2>&1");
  EXPECT_EQ(writable.exit_code, 1) << writable.out;
  EXPECT_TRUE(Has(writable.out, "runtime directory " + dir + " has mode 0777")) << writable.out;
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  const CtlRun own = Batonctl(args, "2>&1");
  EXPECT_EQ(own.exit_code, 1) << own.out;
  EXPECT_FALSE(Has(own.out, "runtime directory")) << "only unreachable: " << own.out;
  // Made under /tmp by another user: refused even to root.
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
    const CtlRun foreign = Batonctl(args, "2>&1");
    EXPECT_EQ(foreign.exit_code, 1) << foreign.out;
    EXPECT_TRUE(Has(foreign.out, "runtime directory " + dir + " is owned by uid 65534"))
        << foreign.out;
  }
}

}  // namespace
}  // namespace baton
