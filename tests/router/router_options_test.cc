// RouterOptions: flags, the TOML file, and the errors that name what broke.
#include "router/router_options.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace baton {
namespace {

TEST(RouterOptions, Defaults) {
  Result<RouterOptions> o = ParseRouterFlags({});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->listen_host, "127.0.0.1");
  EXPECT_EQ(o->listen_port, 8000);
  EXPECT_NE(o->controller_socket.find("controller.sock"), std::string::npos);
  EXPECT_TRUE(o->backend.empty());
  EXPECT_EQ(o->shadow_every, 1);
}

TEST(RouterOptions, ShadowEvery) {
  Result<RouterOptions> o = ParseRouterFlags({"--shadow-every", "0"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->shadow_every, 0);
  RouterOptions t;
  ASSERT_TRUE(ParseRouterToml("[router]\nshadow_every = 10\n", "r.toml", &t).ok());
  EXPECT_EQ(t.shadow_every, 10);
  o = ParseRouterFlags({"--shadow-every", "-1"});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("shadow-every"), std::string::npos);
}

TEST(RouterOptions, EngineRetention) {
  EXPECT_EQ(RouterOptions().engine_retention, std::chrono::minutes(10));
  Result<RouterOptions> o = ParseRouterFlags({"--engine-retention-ms", "0"});  // never
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->engine_retention.count(), 0);
  RouterOptions t;
  ASSERT_TRUE(ParseRouterToml("[router]\nengine_retention_ms = 3600000\n", "r.toml", &t).ok());
  EXPECT_EQ(t.engine_retention, std::chrono::hours(1));
  o = ParseRouterFlags({"--engine-retention-ms", "-1"});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("engine-retention-ms"), std::string::npos);
}

TEST(RouterOptions, Flags) {
  Result<RouterOptions> o =
      ParseRouterFlags({"--listen", "127.0.0.1:9000", "--backend=127.0.0.1:7000", "--api-key", "k",
                        "--max-body-bytes", "100", "--first-byte-timeout-ms", "250"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->listen_port, 9000);
  EXPECT_EQ(o->backend, "127.0.0.1:7000");
  EXPECT_EQ(o->api_key, "k");
  EXPECT_EQ(o->max_body_bytes, 100u);
  EXPECT_EQ(o->first_byte_timeout, std::chrono::milliseconds(250));
}

TEST(RouterOptions, BadFlagsNameTheFlag) {
  Result<RouterOptions> o = ParseRouterFlags({"--listen", "nowhere"});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("listen"), std::string::npos) << o.status().ToString();
  o = ParseRouterFlags({"--max-body-bytes", "-3"});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("max-body-bytes"), std::string::npos);
  o = ParseRouterFlags({"--frobnicate", "1"});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("frobnicate"), std::string::npos);
  EXPECT_FALSE(ParseRouterFlags({"--api-key"}).ok());
}

// A mistyped flag is unknown whatever follows it (not "missing value"); a refused value is
// quoted back with its flag.
TEST(RouterOptions, AnUnknownFlagIsNamedUnknownWhateverFollowsIt) {
  const auto error = [](std::vector<std::string> args) {
    return ParseRouterFlags(args).status().message();
  };
  EXPECT_EQ(error({"--bogus"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(error({"--bogus", "1"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(error({"--bogus", "--threads", "2"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(error({"--bogus=1"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(error({"--threads"}), "--threads: missing value");
  EXPECT_EQ(error({"--threads", "abc"}), "--threads: not an integer: \"abc\"");
  EXPECT_EQ(error({"--max-queue-wait-ms=soon"}), "--max-queue-wait-ms: not an integer: \"soon\"");
}

// "--config FILE" and "--config=FILE" both read the file, and a flag overrides it wherever
// it stands; a file that cannot be read is an error, never silently the defaults.
TEST(RouterOptions, ConfigFileInBothFlagForms) {
  const std::string path = ::testing::TempDir() + "/router-options-test.toml";
  {
    std::ofstream out(path);
    out << "[router]\nlisten = \"127.0.0.1:9100\"\nmax_body_bytes = 42\n";
  }
  for (const std::string& form : {std::string("--config=") + path, std::string("--config")}) {
    std::vector<std::string> args = {"--max-body-bytes", "7", form};
    if (form == "--config") args.push_back(path);
    Result<RouterOptions> o = ParseRouterFlags(args);
    ASSERT_TRUE(o.ok()) << form << ": " << o.status().ToString();
    EXPECT_EQ(o->listen_port, 9100) << form;
    EXPECT_EQ(o->max_body_bytes, 7u) << form << ": the flag wins";
  }
  Result<RouterOptions> missing = ParseRouterFlags({"--config=/nonexistent/router.toml"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/router.toml"), std::string::npos);
  EXPECT_FALSE(ParseRouterFlags({"--config="}).ok());
  std::remove(path.c_str());
  // A directory opens as a stream and read as an empty config: refused.
  Result<RouterOptions> dir = ParseRouterFlags({"--config", "/"});
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().message(), "--config: /: is a directory");
  Result<RouterOptions> device = ParseRouterFlags({"--config", "/dev/null"});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().message(), "--config: /dev/null: not a regular file");
}

// The file's errors name the key as written; ramp_steps may be an array, as the controller's
// upgrade.steps is.
TEST(RouterOptions, TomlKeysAsWrittenAndRampStepsAsAnArray) {
  RouterOptions o;
  ASSERT_TRUE(ParseRouterToml("[router]\nramp_steps = [20, 50, 100]\n", "r.toml", &o).ok());
  EXPECT_EQ(o.ramp_steps, (std::vector<double>{0.2, 0.5, 1.0}));
  ASSERT_TRUE(ParseRouterToml("[router]\nramp_steps = \"40,100\"\n", "r.toml", &o).ok());
  EXPECT_EQ(o.ramp_steps, (std::vector<double>{0.4, 1.0}));
  Status st = ParseRouterToml("[router]\nmax_queue_wait_ms = -5\n", "r.toml", &o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("router.max_queue_wait_ms"), std::string::npos) << st.ToString();
  EXPECT_FALSE(ParseRouterToml("[router]\nramp_steps = [\"a\"]\n", "r.toml", &o).ok());
}

TEST(RouterOptions, Toml) {
  RouterOptions o;
  ASSERT_TRUE(ParseRouterToml("[router]\nlisten = \"0.0.0.0:8100\"\nmax_body_bytes = 42\n"
                              "connect_timeout_ms = 10\n",
                              "r.toml", &o)
                  .ok());
  EXPECT_EQ(o.listen_host, "0.0.0.0");
  EXPECT_EQ(o.listen_port, 8100);
  EXPECT_EQ(o.max_body_bytes, 42u);
  EXPECT_EQ(o.connect_timeout, std::chrono::milliseconds(10));
  Status st = ParseRouterToml("[router]\nbogus = 1\n", "r.toml", &o);
  EXPECT_NE(st.message().find("router.bogus"), std::string::npos) << st.ToString();
  st = ParseRouterToml("[router\n", "r.toml", &o);
  EXPECT_FALSE(st.ok());
  st = ParseRouterToml("[router]\nthreads = 0\n", "r.toml", &o);
  EXPECT_NE(st.message().find("threads"), std::string::npos) << st.ToString();
  // A value of the wrong type says what it got.
  st = ParseRouterToml("[router]\nthreads = 2.5\n", "r.toml", &o);
  EXPECT_NE(st.message().find("router.threads: want an integer, got 2.5"), std::string::npos)
      << st.ToString();
  st = ParseRouterToml("[router]\nthreads = true\n", "r.toml", &o);
  EXPECT_NE(st.message().find("got a boolean"), std::string::npos) << st.ToString();
}

// A stall timeout under a second would report engines that merely pause as hung.
TEST(RouterOptions, AStallTimeoutIsOffOrAtLeastASecond) {
  RouterOptions o;
  EXPECT_TRUE(ParseRouterToml("[router]\nstall_timeout_ms = 0\n", "r.toml", &o).ok());
  EXPECT_TRUE(ParseRouterToml("[router]\nstall_timeout_ms = 1000\n", "r.toml", &o).ok());
  const Status s = ParseRouterToml("[router]\nstall_timeout_ms = 500\n", "r.toml", &o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("stall_timeout_ms: must be 0 (off) or at least 1000, got 500"),
            std::string::npos)
      << s.message();
}

// toml11 parses nesting by recursion: a deep file is refused before it overflows the stack.
TEST(RouterOptions, DeeplyNestedTomlIsRefusedNotParsed) {
  RouterOptions o;
  const std::string deep = "[router]\nlisten = " + std::string(20000, '[') + "]\n";
  const Status s = ParseRouterToml(deep, "r.toml", &o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(
      s.message().find("r.toml: arrays, tables and dotted keys nested 20001 deep (at most 32)"),
      std::string::npos)
      << s.message();
  // A dotted key builds its tables by recursion too: 100,000 segments overflowed the stack.
  std::string key = "a";
  for (int i = 1; i < 100000; ++i) key += ".a";
  for (const std::string& text : {key + " = 1\n", "[" + key + "]\n"}) {
    const Status d = ParseRouterToml(text, "r.toml", &o);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.message().find("r.toml: arrays, tables and dotted keys nested"), std::string::npos)
        << d.message();
  }
}

TEST(RouterOptions, AMalformedEtcdEndpointIsRefused) {
  for (const char* bad :
       {"bogus", "ftp://127.0.0.1:2379", "127.0.0.1:99999", "h:notaport", "127.0.0.1:2379,h:0"}) {
    Result<RouterOptions> o = ParseRouterFlags({"--etcd", bad});
    EXPECT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("etcd"), std::string::npos) << o.status().ToString();
  }
  EXPECT_TRUE(ParseRouterFlags({"--etcd", "127.0.0.1:2379,http://h:1"}).ok());
}

// A fleet setting without --etcd is refused, from a flag or from the file: the router would
// otherwise follow one controller while its operator believes it follows the fleet.
TEST(RouterOptions, AFleetSettingWithoutEtcdIsRefused) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--fleet-poll-ms", "50"},
                                               {"--etcd-prefix", "/other/"},
                                               {"--fleet-router-name", "r1"},
                                               {"--fleet-suspect-ms", "100"},
                                               {"--etcd-timeout-ms", "200"}}) {
    Result<RouterOptions> o = ParseRouterFlags(args);
    ASSERT_FALSE(o.ok()) << args[0];
    EXPECT_EQ(
        o.status().message(),
        args[0] + " is a fleet setting and needs --etcd (the members to read the fleet from)");
    std::vector<std::string> with = args;
    with.insert(with.end(), {"--etcd", "127.0.0.1:2379"});
    EXPECT_TRUE(ParseRouterFlags(with).ok()) << args[0];
  }
  const std::string path = "/tmp/baton-router-fleet-" + std::to_string(::getpid()) + ".toml";
  std::ofstream(path) << "[router]\nfleet_poll_ms = 50\n";
  Result<RouterOptions> o = ParseRouterFlags({"--config", path});
  std::filesystem::remove(path);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--fleet-poll-ms is a fleet setting"), std::string::npos);
}

TEST(RouterOptions, EtcdTlsFiles) {
  const std::string dir = "/tmp/baton-router-tls-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  for (const char* f : {"/ca.pem", "/client.pem", "/client.key"}) std::ofstream(dir + f) << "x\n";
  const std::vector<std::string> tls = {"--etcd-ca-file",   dir + "/ca.pem",
                                        "--etcd-cert-file", dir + "/client.pem",
                                        "--etcd-key-file",  dir + "/client.key"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.begin(), tls.begin(), tls.end());
    return ParseRouterFlags(args);
  };
  Result<RouterOptions> o = with({"--etcd", "https://127.0.0.11:2379,127.0.0.12:2379"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->etcd_ca_file, dir + "/ca.pem");
  EXPECT_EQ(o->etcd_cert_file, dir + "/client.pem");
  EXPECT_EQ(o->etcd_key_file, dir + "/client.key");
  // The CA alone: the router verifies the members and presents no certificate.
  EXPECT_TRUE(ParseRouterFlags({"--etcd", "https://a:1", "--etcd-ca-file", dir + "/ca.pem"}).ok());

  auto error = [](const Result<RouterOptions>& r) {
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  EXPECT_EQ(error(ParseRouterFlags({"--etcd-ca-file", dir + "/none.pem"})),
            "--etcd-ca-file: cannot read \"" + dir + "/none.pem\": No such file or directory");
  EXPECT_NE(error(ParseRouterFlags({"--etcd-key-file", dir})).find("not a regular file"),
            std::string::npos);
  EXPECT_EQ(error(ParseRouterFlags({"--etcd", "a:1", "--etcd-ca-file", dir + "/ca.pem",
                                    "--etcd-cert-file", dir + "/client.pem"})),
            "--etcd-cert-file needs --etcd-key-file");
  EXPECT_NE(error(ParseRouterFlags({"--etcd", "https://a:1"})).find("--etcd-ca-file must name"),
            std::string::npos);
  EXPECT_NE(error(with({"--etcd", "http://a:1"})).find("plain http"), std::string::npos);
  EXPECT_NE(error(ParseRouterFlags({"--etcd", "a:1", "--etcd-cert-file", dir + "/client.pem",
                                    "--etcd-key-file", dir + "/client.key"}))
                .find("--etcd-cert-file needs --etcd-ca-file"),
            std::string::npos);

  RouterOptions t;
  Status st = ParseRouterToml("[router]\netcd_ca_file = \"" + dir + "/none.pem\"\n", "r.toml", &t);
  EXPECT_EQ(st.message(), "r.toml: router.etcd_ca_file: cannot read \"" + dir +
                              "/none.pem\": No such file or directory");
  ASSERT_TRUE(
      ParseRouterToml("[router]\netcd_ca_file = \"" + dir + "/ca.pem\"\n", "r.toml", &t).ok());
  EXPECT_EQ(t.etcd_ca_file, dir + "/ca.pem");
  std::filesystem::remove_all(dir);
}

// With fewer file descriptors than max_connections clients need (each with an engine
// connection of its own), the router says so at start: accepts would fail before the 503.
TEST(RouterFdLimit, TooFewFileDescriptorsForMaxConnectionsAreWarnedOf) {
  const std::string router = std::string(BATON_BIN_DIR) + "/baton-router";
  const std::string run = "ulimit -n 600 && exec timeout -s TERM 1 " + router +
                          " --listen 127.0.0.1:0 --backend 127.0.0.1:1 2>&1";
  FILE* out = ::popen(("sh -c '" + run + "'").c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string log;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), out)) log.append(buf, n);
  ::pclose(out);
  EXPECT_NE(log.find("max_connections 4096 needs about 8448 file descriptors, and RLIMIT_NOFILE "
                     "allows 600: past about 172 clients"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace baton
