#include "fleet/plaintext_etcd.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>

namespace baton {
namespace {

// The host of "[scheme://]host:port" as JsonHttpClient reads it: all before the last ':'.
std::string_view HostOf(std::string_view endpoint) {
  if (const size_t scheme = endpoint.find("://"); scheme != std::string_view::npos) {
    endpoint.remove_prefix(scheme + 3);
  }
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.remove_suffix(1);
  return endpoint.substr(0, endpoint.rfind(':'));
}

}  // namespace

bool IsLoopbackHost(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::string name(host);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name == "localhost" || name == "localhost.") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, name.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, name.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

std::vector<std::string> PlaintextRemoteEndpoints(const std::vector<std::string>& endpoints,
                                                  bool tls) {
  std::vector<std::string> out;
  if (tls) return out;
  for (const std::string& e : endpoints) {
    if (e.rfind("https://", 0) == 0) continue;
    if (!IsLoopbackHost(HostOf(e))) out.push_back(e);
  }
  return out;
}

std::string PlaintextEtcdWarning(const std::vector<std::string>& endpoints) {
  std::string list;
  for (const std::string& e : endpoints) list += (list.empty() ? "" : ", ") + e;
  return "etcd " + list +
         " is reached in plain HTTP off this host: anyone on the path can read and write the "
         "fleet's records (the commands rollouts run, the addresses routers send traffic to); "
         "set etcd_ca_file and https:// endpoints (docs/fleet.md, Security)";
}

}  // namespace baton
