// TlsClientContext: the TLS settings of a client that reaches a server over https (etcd's
// members, fleet/etcd_client.h): the CA certificates that the server's certificate must chain
// to, and optionally a client certificate with its private key for servers that ask for one
// (etcd's --client-cert-auth).
//
// Create() loads and checks every file once; a missing or unreadable file is NotFound, a file
// that is not what it should be (no PEM certificate, a key that does not match the
// certificate, an encrypted key) is InvalidArgument, each message naming the file. On every
// handshake the server's certificate must chain to one of the CAs, and, once a connection is
// prepared with PrepareConnection(), name the host or IP address the client connected to
// (its subjectAltName). TLS 1.2 or newer.
//
// Ownership: owns the OpenSSL context. Thread-safe once created: many connections, on any
// thread, may share one context.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"

struct ssl_st;  // OpenSSL's SSL

namespace boost::asio::ssl {
class context;
}

namespace baton {

struct TlsClientOptions {
  std::string ca_file{};    // PEM: the CA certificates that sign the server's certificate
  std::string cert_file{};  // PEM: this client's certificate (chain); with key_file, or neither
  std::string key_file{};   // PEM: the private key of cert_file, unencrypted

  // True when nothing is set: the client speaks plain HTTP.
  bool empty() const { return ca_file.empty() && cert_file.empty() && key_file.empty(); }
};

class TlsClientContext {
 public:
  static Result<std::shared_ptr<TlsClientContext>> Create(const TlsClientOptions& options);
  ~TlsClientContext();
  TlsClientContext(const TlsClientContext&) = delete;
  TlsClientContext& operator=(const TlsClientContext&) = delete;

  boost::asio::ssl::context& native() { return *context_; }
  const TlsClientOptions& options() const { return options_; }

  // Makes one connection's handshake check that the server's certificate is issued to `host`
  // (a DNS name, or an IPv4/IPv6 address matched against the certificate's IP addresses), and
  // sends `host` as the server name (SNI) when it is a name.
  static Status PrepareConnection(ssl_st* ssl, const std::string& host);
  // Why the server's certificate was refused on `ssl` ("certificate has expired", "IP address
  // mismatch"); empty when it was not.
  static std::string VerifyFailure(const ssl_st* ssl);

 private:
  TlsClientContext(TlsClientOptions options, std::unique_ptr<boost::asio::ssl::context> context);

  TlsClientOptions options_;
  std::unique_ptr<boost::asio::ssl::context> context_;
};

// Checks that `path` names a regular file this process can read: NotFound otherwise, the
// message beginning with `what` (a flag or a configuration key).
Status CheckReadableFile(const std::string& what, const std::string& path);

}  // namespace baton
