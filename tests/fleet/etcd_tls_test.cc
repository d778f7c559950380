// EtcdClient over TLS against a real etcd member that asks for client certificates
// (tests/fleet/etcd_cluster.h in its TLS mode): calls with a certificate of the cluster's CA
// work; a client without a certificate, a member whose certificate comes from another CA or
// names another address, and missing or invalid files each fail with an error that says why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fleet/etcd_client.h"
#include "fleet/tls_client_context.h"
#include "tests/fleet/etcd_cluster.h"

namespace baton {
namespace {

using fleet_test::EtcdCluster;
using fleet_test::TestCertificates;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
    cluster_ = std::make_unique<EtcdCluster>(1, /*tls=*/true);
    ASSERT_TRUE(cluster_->certs().has_value())
        << "openssl could not make the certificates; see " << cluster_->dir() << "/pki";
    ASSERT_TRUE(cluster_->WaitHealthy()) << "etcd did not come up:\n" << cluster_->LogTails();
  }

  Result<std::unique_ptr<EtcdClient>> Client(TlsClientOptions tls) {
    return EtcdClient::Create(
        {.endpoints = cluster_->endpoints(), .timeout = milliseconds(1000), .tls = tls});
  }

  std::unique_ptr<EtcdCluster> cluster_;
};

TEST_F(EtcdTlsTest, KeysAndLeasesWorkWithAClientCertificate) {
  ASSERT_THAT(cluster_->endpoints().front(), ::testing::StartsWith("https://"));
  auto client = Client(cluster_->client_tls());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE((*client)->Put("/baton/nodes/a", "alpha").ok());
  Result<std::optional<EtcdKeyValue>> a = (*client)->Get("/baton/nodes/a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, "alpha");
  Result<int64_t> lease = (*client)->GrantLease(seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_TRUE((*client)->Put("/baton/nodes/b", "beta", *lease).ok());
  Result<int64_t> ttl = (*client)->KeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GT(*ttl, 0);
  EXPECT_EQ((*client)->GetPrefix("/baton/nodes/")->kvs.size(), 2u);

  // An endpoint without a scheme is reached with TLS too when TLS is set.
  const EtcdCluster::Member& m = cluster_->member(0);
  auto bare = EtcdClient::Create(
      {.endpoints = {m.ip + ":" + std::to_string(m.client_port)}, .tls = cluster_->client_tls()});
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  Result<std::optional<EtcdKeyValue>> again = (*bare)->Get("/baton/nodes/a");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->has_value());
}

TEST_F(EtcdTlsTest, WithoutAClientCertificateTheMemberRefusesTheCall) {
  auto client = Client({.ca_file = cluster_->certs()->ca});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Result<int64_t> put = (*client)->Put("/baton/x", "y");
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(put.status().message(), HasSubstr("this client presents no certificate"));
  std::printf("without a client certificate: %s\n", put.status().ToString().c_str());
}

TEST_F(EtcdTlsTest, AMemberCertificateOfAnotherCaIsRefused) {
  TlsClientOptions tls = cluster_->client_tls();
  tls.ca_file = cluster_->certs()->other_ca;
  auto client = Client(tls);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Result<int64_t> put = (*client)->Put("/baton/x", "y");
  ASSERT_FALSE(put.ok());
  EXPECT_THAT(put.status().message(), HasSubstr("the server's certificate is refused"));
  EXPECT_THAT(put.status().message(), HasSubstr("local issuer certificate"));
  std::printf("another CA: %s\n", put.status().ToString().c_str());
}

TEST_F(EtcdTlsTest, PlainHttpToATlsMemberFails) {
  const EtcdCluster::Member& m = cluster_->member(0);
  auto client =
      EtcdClient::Create({.endpoints = {"http://" + m.ip + ":" + std::to_string(m.client_port)}});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_FALSE((*client)->Put("/baton/x", "y").ok());
}

// The member's certificate is signed by the right CA but names another host: the address
// the client connected to must be in it.
TEST(EtcdTlsNameTest, AMemberCertificateForAnotherAddressIsRefused) {
  ASSERT_TRUE(EtcdCluster::Installed()) << "etcd-server is not installed (scripts/install-deps)";
  EtcdCluster cluster(1, /*tls=*/true, "DNS:etcd.invalid,IP:127.0.0.99");
  ASSERT_TRUE(cluster.certs().has_value());
  auto client = EtcdClient::Create({.endpoints = cluster.endpoints(),
                                    .timeout = milliseconds(500),
                                    .tls = cluster.client_tls()});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // Until the member listens the call fails otherwise (connection refused).
  Status last = OkStatus();
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    last = (*client)->Put("/baton/x", "y").status();
    ASSERT_FALSE(last.ok()) << "a member with another address's certificate was trusted";
    if (last.message().find("refused:") != std::string::npos) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_THAT(last.message(), HasSubstr("IP address mismatch"));
  std::printf("another address: %s\n", last.ToString().c_str());
}

class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/baton-tls-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto certs = TestCertificates::Make(dir_, "IP:127.0.0.11");
    ASSERT_TRUE(certs.has_value()) << "openssl failed; see " << dir_ << "/openssl.log";
    certs_ = *certs;
    std::ofstream(dir_ + "/garbage.pem") << "not a certificate\n";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string dir_;
  TestCertificates certs_;
};

TEST_F(TlsFilesTest, AGoodSetLoads) {
  auto ok = TlsClientContext::Create(
      {.ca_file = certs_.ca, .cert_file = certs_.client_cert, .key_file = certs_.client_key});
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(TlsClientContext::Create({.ca_file = certs_.ca}).ok());
}

TEST_F(TlsFilesTest, MissingUnreadableAndInvalidFilesAreNamed) {
  const std::string missing = dir_ + "/missing.pem";
  auto r = TlsClientContext::Create({.ca_file = missing});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("TLS CA file: cannot read \"" + missing + "\""));
  EXPECT_THAT(r.status().message(), HasSubstr("No such file"));

  r = TlsClientContext::Create({.ca_file = dir_});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("is not a regular file"));

  r = TlsClientContext::Create({.ca_file = dir_ + "/garbage.pem"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("garbage.pem\": no PEM certificate"));

  r = TlsClientContext::Create(
      {.ca_file = certs_.ca, .cert_file = dir_ + "/garbage.pem", .key_file = certs_.client_key});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("TLS certificate file"));

  r = TlsClientContext::Create(
      {.ca_file = certs_.ca, .cert_file = certs_.client_cert, .key_file = dir_ + "/garbage.pem"});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("TLS key file"));

  // An encrypted key is refused at once: nothing asks for its passphrase.
  r = TlsClientContext::Create({.ca_file = certs_.ca,
                                .cert_file = certs_.client_cert,
                                .key_file = certs_.client_key_encrypted});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not an unencrypted PEM private key"));

  r = TlsClientContext::Create(
      {.ca_file = certs_.ca, .cert_file = certs_.client_cert, .key_file = missing});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("TLS key file: cannot read"));

  r = TlsClientContext::Create(
      {.ca_file = certs_.ca, .cert_file = certs_.client_cert, .key_file = certs_.server_key});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("does not match the certificate"));

  r = TlsClientContext::Create({.ca_file = certs_.ca, .cert_file = certs_.client_cert});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("set together"));

  r = TlsClientContext::Create({.cert_file = certs_.client_cert, .key_file = certs_.client_key});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("no CA file"));
}

TEST_F(TlsFilesTest, HttpsAndPlainHttpDoNotMix) {
  auto r = EtcdClient::Create({.endpoints = {"https://127.0.0.11:2379"}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("https needs a CA file"));

  r = EtcdClient::Create({.endpoints = {"https://127.0.0.11:2379", "http://127.0.0.12:2379"},
                          .tls = {.ca_file = certs_.ca}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("http://127.0.0.12:2379: plain http"));

  r = EtcdClient::Create({.endpoints = {"127.0.0.11:2379"}, .tls = {.ca_file = dir_ + "/none"}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("etcd: TLS CA file: cannot read"));

  // Plain http keeps working as before: nothing is loaded.
  EXPECT_TRUE(
      EtcdClient::Create({.endpoints = {"127.0.0.11:2379", "http://127.0.0.12:2379"}}).ok());
}

}  // namespace
}  // namespace baton
