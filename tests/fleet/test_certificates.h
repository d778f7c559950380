// TestCertificates: a throwaway PKI for TLS tests, made with the `openssl` command line in a
// directory of the caller's: a CA, a server certificate signed by it for the given
// subjectAltNames (usable as a client certificate too, as etcd 3.4's gateway presents it to
// its own member), a client certificate signed by it, and a second, unrelated CA. P-256 keys,
// valid for two days, PEM files; the keys are unencrypted but for a copy of the client's key
// encrypted with the passphrase "baton" (client_key_encrypted).
//
// Header-only test support; one thread.
#pragma once

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

namespace baton::fleet_test {

struct TestCertificates {
  std::string dir;
  std::string ca, ca_key;
  std::string server_cert, server_key;
  std::string client_cert, client_key, client_key_encrypted;
  std::string other_ca;

  // `server_sans`: e.g. "IP:127.0.0.11,IP:127.0.0.12". nullopt when openssl failed; its
  // output is in <dir>/openssl.log.
  static std::optional<TestCertificates> Make(const std::string& dir,
                                              const std::string& server_sans) {
    TestCertificates t;
    t.dir = dir;
    t.ca = dir + "/ca.pem";
    t.ca_key = dir + "/ca.key";
    t.server_cert = dir + "/server.pem";
    t.server_key = dir + "/server.key";
    t.client_cert = dir + "/client.pem";
    t.client_key = dir + "/client.key";
    t.client_key_encrypted = dir + "/client-encrypted.key";
    t.other_ca = dir + "/other-ca.pem";
    {
      std::ofstream cnf(dir + "/openssl.cnf");
      cnf << "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = baton-test\n"
          << "[ca_ext]\nbasicConstraints = critical,CA:TRUE\n"
          << "keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n"
          << "[server_ext]\nbasicConstraints = CA:FALSE\n"
          << "keyUsage = critical,digitalSignature,keyEncipherment\n"
          << "extendedKeyUsage = serverAuth,clientAuth\n"
          << "subjectAltName = " << server_sans << "\n"
          << "[client_ext]\nbasicConstraints = CA:FALSE\n"
          << "keyUsage = critical,digitalSignature\nextendedKeyUsage = clientAuth\n";
      if (!cnf) return std::nullopt;
    }
    const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script =
        "cd '" + dir + "' && exec >>openssl.log 2>&1 && " +
        "openssl req -x509 -config openssl.cnf -extensions ca_ext" + key +
        " -days 2 -subj /CN=baton-test-ca -keyout ca.key -out ca.pem && " +
        "openssl req -x509 -config openssl.cnf -extensions ca_ext" + key +
        " -days 2 -subj /CN=baton-other-ca -keyout other-ca.key -out other-ca.pem && " +
        "openssl req -new -config openssl.cnf" + key +
        " -subj /CN=etcd -keyout server.key -out server.csr && " +
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 2" +
        " -extfile openssl.cnf -extensions server_ext -out server.pem && " +
        "openssl req -new -config openssl.cnf" + key +
        " -subj /CN=baton-client -keyout client.key -out client.csr && " +
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -set_serial 3 -days 2" +
        " -extfile openssl.cnf -extensions client_ext -out client.pem && " +
        "openssl pkey -in client.key -aes256 -passout pass:baton -out client-encrypted.key";
    if (std::system(script.c_str()) != 0) return std::nullopt;
    return t;
  }
};

}  // namespace baton::fleet_test
