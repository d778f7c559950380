// Which etcd endpoints are warned of as plain HTTP off the host (fleet/plaintext_etcd.h): the
// loopback in any spelling is silent, any other host is named, https and TLS are silent.
#include "fleet/plaintext_etcd.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(PlaintextEtcd, LoopbackHosts) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "localhost.", "::1",
                           "[::1]", "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"10.0.0.1", "128.0.0.1", "0.0.0.0", "etcd-1", "localhost.example",
                           "127.0.0.1.example.com", "::", "[fe80::1]", "::ffff:10.0.0.1", ""}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(PlaintextEtcd, OnlyPlainEndpointsOffTheLoopbackAreNamed) {
  const std::vector<std::string> endpoints = {"http://127.0.0.1:2379", "localhost:2379",
                                              "http://[::1]:2379",     "http://10.0.0.1:2379",
                                              "etcd-2:2379",           "https://10.0.0.3:2379",
                                              "http://etcd-4:2379/"};
  EXPECT_EQ(
      PlaintextRemoteEndpoints(endpoints, false),
      (std::vector<std::string>{"http://10.0.0.1:2379", "etcd-2:2379", "http://etcd-4:2379/"}));
  EXPECT_TRUE(PlaintextRemoteEndpoints(endpoints, true).empty()) << "TLS: every one is https";
  EXPECT_TRUE(
      PlaintextRemoteEndpoints({"http://127.0.0.1:2379", "127.0.0.1:23790"}, false).empty());
}

TEST(PlaintextEtcd, TheWarningNamesTheEndpointsAndWhatIsExposed) {
  const std::string w = PlaintextEtcdWarning({"http://10.0.0.1:2379", "etcd-2:2379"});
  EXPECT_NE(w.find("http://10.0.0.1:2379, etcd-2:2379"), std::string::npos) << w;
  EXPECT_NE(w.find("anyone on the path can read and write"), std::string::npos) << w;
  EXPECT_NE(w.find("etcd_ca_file"), std::string::npos) << w;
}

}  // namespace
}  // namespace baton
