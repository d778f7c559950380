#include "fleet/tls_client_context.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <sys/stat.h>

#include <boost/asio/ssl/context.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace baton {
namespace {

namespace ssl = boost::asio::ssl;

// OpenSSL's reason for the last failure, and the error queue cleared.
std::string OpenSslReason() {
  std::string reason;
  while (unsigned long e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof(text));
    if (reason.empty()) reason = text;
  }
  return reason.empty() ? "unknown OpenSSL error" : reason;
}

// Refuses to ask for a passphrase: an encrypted key fails to load instead of waiting on a
// terminal.
int NoPassphrase(char*, int, int, void*) { return 0; }

}  // namespace

Status CheckReadableFile(const std::string& what, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return NotFound(what + ": cannot read \"" + path + "\": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return NotFound(what + ": \"" + path + "\" is not a regular file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return NotFound(what + ": cannot read \"" + path + "\": " + std::strerror(errno));
  }
  std::fclose(f);
  return OkStatus();
}

TlsClientContext::TlsClientContext(TlsClientOptions options,
                                   std::unique_ptr<boost::asio::ssl::context> context)
    : options_(std::move(options)), context_(std::move(context)) {}
TlsClientContext::~TlsClientContext() = default;

Result<std::shared_ptr<TlsClientContext>> TlsClientContext::Create(
    const TlsClientOptions& options) {
  if (options.ca_file.empty()) {
    return InvalidArgument("TLS: no CA file: the server's certificate cannot be verified");
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return InvalidArgument("TLS: a client certificate and its key are set together, or neither");
  }
  BATON_RETURN_IF_ERROR(CheckReadableFile("TLS CA file", options.ca_file));
  if (!options.cert_file.empty()) {
    BATON_RETURN_IF_ERROR(CheckReadableFile("TLS certificate file", options.cert_file));
    BATON_RETURN_IF_ERROR(CheckReadableFile("TLS key file", options.key_file));
  }
  std::unique_ptr<ssl::context> context;
  try {
    context = std::make_unique<ssl::context>(ssl::context::tls_client);
  } catch (const std::exception& e) {
    return Internal(std::string("TLS: cannot create an OpenSSL context: ") + e.what());
  }
  SSL_CTX* native = context->native_handle();
  ERR_clear_error();
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1) {
    return Internal("TLS: cannot require TLS 1.2: " + OpenSslReason());
  }
  if (SSL_CTX_load_verify_locations(native, options.ca_file.c_str(), nullptr) != 1) {
    return InvalidArgument("TLS CA file \"" + options.ca_file +
                           "\": no PEM certificate could be loaded: " + OpenSslReason());
  }
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER, nullptr);
  if (!options.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(native, options.cert_file.c_str()) != 1) {
      return InvalidArgument("TLS certificate file \"" + options.cert_file +
                             "\": not a PEM certificate: " + OpenSslReason());
    }
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_file(options.key_file.c_str(), "r"),
                                                  &BIO_free);
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
        bio == nullptr ? nullptr
                       : PEM_read_bio_PrivateKey(bio.get(), nullptr, &NoPassphrase, nullptr),
        &EVP_PKEY_free);
    if (key == nullptr) {
      return InvalidArgument("TLS key file \"" + options.key_file +
                             "\": not an unencrypted PEM private key: " + OpenSslReason());
    }
    if (SSL_CTX_use_PrivateKey(native, key.get()) != 1 || SSL_CTX_check_private_key(native) != 1) {
      return InvalidArgument("TLS key file \"" + options.key_file +
                             "\" does not match the certificate \"" + options.cert_file +
                             "\": " + OpenSslReason());
    }
  }
  return std::shared_ptr<TlsClientContext>(new TlsClientContext(options, std::move(context)));
}

Status TlsClientContext::PrepareConnection(ssl_st* ssl, const std::string& host) {
  ERR_clear_error();
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1) return OkStatus();
  ERR_clear_error();  // not an address: a name
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  if (X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size()) != 1 ||
      SSL_set_tlsext_host_name(ssl, host.c_str()) != 1) {
    return InvalidArgument("TLS: \"" + host + "\" is not a host name: " + OpenSslReason());
  }
  return OkStatus();
}

std::string TlsClientContext::VerifyFailure(const ssl_st* ssl) {
  const long result = SSL_get_verify_result(ssl);
  if (result == X509_V_OK) return std::string();
  return X509_verify_cert_error_string(result);
}

}  // namespace baton
