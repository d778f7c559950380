// FinishFleetConfig: the [fleet] rules of FinishConfig (config.h).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "controller/config.h"
#include "fleet/json_http_client.h"
#include "fleet/tls_client_context.h"

namespace baton {
namespace {

// A key part: printable ASCII without '/', so that a node is one key under the prefix.
bool IsKeyPart(const std::string& s) {
  return !s.empty() && s.size() <= 128 &&
         std::all_of(s.begin(), s.end(), [](char ch) { return ch > ' ' && ch < 127 && ch != '/'; });
}

// The TLS keys: readable files, a certificate with its key, and https only with a CA.
Status CheckFleetTls(const ControllerConfig& c) {
  const bool tls = !c.fleet_etcd_ca_file.empty();
  if (c.fleet_etcd_cert_file.empty() != c.fleet_etcd_key_file.empty()) {
    return InvalidArgument(c.fleet_etcd_cert_file.empty()
                               ? "fleet.etcd_cert_file: not set, but etcd_key_file is"
                               : "fleet.etcd_key_file: not set, but etcd_cert_file is");
  }
  if (!tls && !c.fleet_etcd_cert_file.empty()) {
    return InvalidArgument(
        "fleet.etcd_ca_file: not set, but etcd_cert_file is (TLS to etcd needs the CA that "
        "signs the members' certificates)");
  }
  for (const std::string& e : c.fleet_etcd) {
    if (Status ok = CheckHttpEndpoint(e); !ok.ok()) {
      return InvalidArgument("fleet.etcd: " + ok.message());
    }
    if (!tls && e.rfind("https://", 0) == 0) {
      return InvalidArgument("fleet.etcd_ca_file: not set, but the endpoint " + e +
                             " is https (the members' certificates must be verified)");
    }
    if (tls && e.rfind("http://", 0) == 0) {
      return InvalidArgument("fleet.etcd: " + e +
                             " is plain http while etcd_ca_file is set (write https://)");
    }
  }
  if (!tls) return OkStatus();
  BATON_RETURN_IF_ERROR(CheckReadableFile("fleet.etcd_ca_file", c.fleet_etcd_ca_file));
  if (c.fleet_etcd_cert_file.empty()) return OkStatus();
  BATON_RETURN_IF_ERROR(CheckReadableFile("fleet.etcd_cert_file", c.fleet_etcd_cert_file));
  return CheckReadableFile("fleet.etcd_key_file", c.fleet_etcd_key_file);
}

}  // namespace

Status FinishFleetConfig(ControllerConfig* c) {
  if (c->fleet_etcd.empty() && !c->fleet_setting.empty()) {
    return InvalidArgument(c->fleet_setting +
                           " is a fleet setting and needs fleet.etcd (the members to register "
                           "with): without it this node is in no fleet");
  }
  if (c->fleet_etcd.empty()) return OkStatus();
  BATON_RETURN_IF_ERROR(CheckFleetTls(*c));
  if (c->fleet_prefix.size() < 2 || c->fleet_prefix.front() != '/' ||
      c->fleet_prefix.back() != '/') {
    return InvalidArgument("fleet.prefix: must start and end with '/', got \"" + c->fleet_prefix +
                           "\"");
  }
  if (c->fleet_node.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0) {
      return InvalidArgument("fleet.node: not set, and the host name cannot be read");
    }
    c->fleet_node = host;
  }
  if (c->fleet_model.empty()) {
    c->fleet_model = std::filesystem::path(c->model_dir).lexically_normal().filename().string();
    if (c->fleet_model.empty()) {
      c->fleet_model = std::filesystem::path(c->model_dir).parent_path().filename().string();
    }
  }
  if (!IsKeyPart(c->fleet_node)) {
    return InvalidArgument("fleet.node: printable ASCII without spaces or '/', got \"" +
                           c->fleet_node + "\"");
  }
  if (c->fleet_model.empty()) return InvalidArgument("fleet.model: must not be empty");
  for (const std::string& p : c->fleet_rollout_programs) {
    if (p.empty() || p.front() != '/') {
      return InvalidArgument(
          "fleet.rollout_programs: \"" + p +
          "\" is not an absolute path (a program, or a directory ending in '/')");
    }
  }
  return OkStatus();
}

}  // namespace baton
