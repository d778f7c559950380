// The [fleet] keys of the controller's configuration (controller/config_fleet.cc): their
// defaults, the rule that a fleet setting needs fleet.etcd, the TLS files and the rollout
// programs, as ParseConfigToml and FinishConfig take them.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "controller/config.h"
#include "controller/fleet_member.h"

namespace baton {
namespace {

// A [fleet] setting without fleet.etcd would do nothing: the node would be in no fleet.
TEST(Config, AFleetSettingWithoutEtcdIsRefused) {
  Result<ControllerConfig> c = ParseConfigToml(
      "[model]\ndir = \"/m\"\n[engine]\ncommand = [\"/bin/true\"]\n"
      "[fleet]\nnode = \"n1\"\n",
      "c.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Status s = FinishConfig(&*c);
  EXPECT_EQ(s.message(),
            "fleet.node is a fleet setting and needs fleet.etcd (the members to register with): "
            "without it this node is in no fleet");
  c->fleet_etcd = {"127.0.0.1:2379"};
  EXPECT_TRUE(FinishConfig(&*c).ok());
}

TEST(Config, FleetKeysAndTheirDefaults) {
  const std::string base =
      "[model]\ndir = \"/models/llama-8b/\"\n[engine]\ncommand = [\"/bin/true\"]\n";
  Result<ControllerConfig> off = ParseConfigToml(base, "t");
  ASSERT_TRUE(off.ok());
  ASSERT_TRUE(FinishConfig(&*off).ok());
  EXPECT_TRUE(off->fleet_etcd.empty());
  Result<ControllerConfig> c = ParseConfigToml(
      base + "[fleet]\netcd = \"127.0.0.1:2379, ,http://127.0.0.2:2379\"\nlease_ttl_ms = 3000\n",
      "t");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(FinishConfig(&*c).ok());
  EXPECT_EQ(c->fleet_etcd, (std::vector<std::string>{"127.0.0.1:2379", "http://127.0.0.2:2379"}));
  EXPECT_EQ(c->fleet_lease_ttl, std::chrono::milliseconds(3000));
  EXPECT_EQ(c->fleet_model, "llama-8b");
  EXPECT_FALSE(c->fleet_node.empty());  // the host name
  EXPECT_EQ(c->fleet_key(), "/baton/nodes/" + c->fleet_node);
  Result<ControllerConfig> list =
      ParseConfigToml(base + "[fleet]\netcd = [\"a:1\", \"b:2\"]\nnode = \"n1\"\n", "t");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->fleet_etcd, (std::vector<std::string>{"a:1", "b:2"}));
  for (const char* bad :
       {"prefix = \"baton\"", "prefix = \"/\"", "node = \"a b\"", "node = \"a/b\""}) {
    Result<ControllerConfig> r =
        ParseConfigToml(base + "[fleet]\netcd = \"a:1\"\n" + bad + "\n", "t");
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(FinishConfig(&*r).ok()) << bad;
  }
  // A malformed endpoint is refused by the check, not found at the start after the weights
  // were loaded.
  for (const char* bad : {"bogus", "ftp://127.0.0.1:2379", "127.0.0.1:99999", "h:notaport"}) {
    Result<ControllerConfig> r =
        ParseConfigToml(base + "[fleet]\netcd = \"" + std::string(bad) + "\"\n", "t");
    ASSERT_TRUE(r.ok()) << bad;
    const Status finished = FinishConfig(&*r);
    EXPECT_FALSE(finished.ok()) << bad;
    EXPECT_NE(finished.message().find("fleet.etcd"), std::string::npos) << finished.ToString();
  }
  EXPECT_FALSE(ParseConfigToml(base + "[fleet]\nlease_ttl_ms = 10\n", "t").ok());
  EXPECT_FALSE(ParseConfigToml(base + "[fleet]\netcd = 5\n", "t").ok());
}

TEST(Config, FleetTlsKeysNameWhatIsWrong) {
  const std::string dir = "/tmp/baton-config-tls-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  for (const char* f : {"/ca.pem", "/node.pem", "/node.key"}) std::ofstream(dir + f) << "x\n";
  const std::string base =
      "[model]\ndir = \"/models/llama-8b/\"\n[engine]\ncommand = [\"/bin/true\"]\n[fleet]\n";
  const std::string ca = "etcd_ca_file = \"" + dir + "/ca.pem\"\n";
  const std::string pair =
      "etcd_cert_file = \"" + dir + "/node.pem\"\netcd_key_file = \"" + dir + "/node.key\"\n";
  auto finish = [&](const std::string& fleet) -> std::string {
    Result<ControllerConfig> c = ParseConfigToml(base + fleet, "t");
    if (!c.ok()) return c.status().message();
    Status st = FinishConfig(&*c);
    return st.ok() ? "ok" : st.message();
  };
  Result<ControllerConfig> c =
      ParseConfigToml(base + "etcd = \"https://10.0.0.1:2379,10.0.0.2:2379\"\n" + ca + pair, "t");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(FinishConfig(&*c).ok());
  EXPECT_EQ(c->fleet_etcd_ca_file, dir + "/ca.pem");
  EXPECT_EQ(c->fleet_etcd_cert_file, dir + "/node.pem");
  EXPECT_EQ(c->fleet_etcd_key_file, dir + "/node.key");
  EtcdOptions etcd = FleetMember::EtcdOptionsOf(*c);
  EXPECT_EQ(etcd.tls.ca_file, dir + "/ca.pem");
  EXPECT_EQ(etcd.tls.key_file, dir + "/node.key");
  EXPECT_EQ(finish("etcd = \"https://a:1\"\n" + ca), "ok");

  EXPECT_EQ(finish("etcd = \"a:1\"\netcd_ca_file = \"" + dir + "/none.pem\"\n"),
            "fleet.etcd_ca_file: cannot read \"" + dir + "/none.pem\": No such file or directory");
  EXPECT_EQ(finish("etcd = \"a:1\"\n" + ca + "etcd_cert_file = \"" + dir + "/node.pem\"\n"),
            "fleet.etcd_key_file: not set, but etcd_cert_file is");
  EXPECT_EQ(finish("etcd = \"a:1\"\n" + ca + "etcd_key_file = \"" + dir + "/node.key\"\n"),
            "fleet.etcd_cert_file: not set, but etcd_key_file is");
  EXPECT_EQ(finish("etcd = \"a:1\"\n" + ca + "etcd_cert_file = \"" + dir +
                   "/node.pem\"\netcd_key_file = \"" + dir + "/none.key\"\n"),
            "fleet.etcd_key_file: cannot read \"" + dir + "/none.key\": No such file or directory");
  EXPECT_EQ(finish("etcd = \"a:1\"\n" + pair).rfind("fleet.etcd_ca_file: not set", 0), 0u);
  EXPECT_EQ(finish("etcd = \"https://a:1\"\n").rfind("fleet.etcd_ca_file: not set", 0), 0u);
  EXPECT_EQ(finish("etcd = \"http://a:1\"\n" + ca).rfind("fleet.etcd: http://a:1 is plain", 0), 0u);
  std::filesystem::remove_all(dir);
}

// fleet.rollout_programs: unset, a rollout may run the engine command's own program only; set,
// absolute programs and directories (a trailing '/'); anything relative is refused at start.
TEST(Config, FleetRolloutProgramsAreAbsolute) {
  const std::string base =
      "[model]\ndir = \"/models/llama-8b/\"\n[engine]\ncommand = "
      "[\"/bin/true\"]\n[fleet]\netcd = \"127.0.0.1:2379\"\n";
  Result<ControllerConfig> c = ParseConfigToml(base, "t");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->fleet_rollout_programs.empty());
  c = ParseConfigToml(
      base + "rollout_programs = [\"/opt/baton/engines/\", \"/usr/bin/baton-refengine\"]\n", "t");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(FinishConfig(&*c).ok());
  EXPECT_EQ(c->fleet_rollout_programs,
            (std::vector<std::string>{"/opt/baton/engines/", "/usr/bin/baton-refengine"}));
  c = ParseConfigToml(base + "rollout_programs = [\"engines/\"]\n", "t");
  ASSERT_TRUE(c.ok());
  const Status relative = FinishConfig(&*c);
  EXPECT_NE(relative.message().find("fleet.rollout_programs: \"engines/\" is not an absolute"),
            std::string::npos)
      << relative.ToString();
  EXPECT_FALSE(ParseConfigToml(base + "rollout_programs = [1]\n", "t").ok());
  // Without fleet.etcd the key does nothing: refused as every [fleet] key is.
  c = ParseConfigToml(
      "[model]\ndir = \"/m\"\n[engine]\ncommand = [\"/bin/true\"]\n[fleet]\n"
      "rollout_programs = [\"/opt/\"]\n",
      "t");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(FinishConfig(&*c).ok());
}

}  // namespace
}  // namespace baton
