// FinishFleetConfig: the [fleet] rules of FinishConfig (config.h).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "controller/config.h"

namespace baton {
namespace {

// A key part: printable ASCII without '/', so that a node is one key under the prefix.
bool IsKeyPart(const std::string& s) {
  return !s.empty() && s.size() <= 128 &&
         std::all_of(s.begin(), s.end(), [](char ch) { return ch > ' ' && ch < 127 && ch != '/'; });
}

}  // namespace

Status FinishFleetConfig(ControllerConfig* c) {
  if (c->fleet_etcd.empty()) return OkStatus();
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
  return OkStatus();
}

}  // namespace baton
