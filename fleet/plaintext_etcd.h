// Plaintext etcd: whether a fleet member (a controller or a router) speaks to etcd in plain
// HTTP over a network. Whoever is on that path reads and writes the fleet's records: the
// commands a rollout makes nodes run, the addresses routers send traffic to (docs/fleet.md,
// Security). Such a configuration is not refused (a lab may run it); it is warned of once at
// start and shown in status. etcd on the loopback (127.0.0.0/8, ::1, localhost) is not
// warned of: nothing leaves the host.
//
// Plain functions of the configured endpoints; no name is resolved. Thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace baton {

// Whether `host` (a name, an IPv4 address, or an IPv6 one with or without brackets) is a
// loopback address: 127.0.0.0/8, ::1, ::ffff:127.x.y.z, or the name localhost (any case, a
// trailing dot allowed). Any other name is not, whatever it would resolve to.
bool IsLoopbackHost(std::string_view host);

// The endpoints ("host:port", "http://host:port", "https://host:port") reached in plain HTTP
// on a host other than the loopback: every non-https one off the loopback when `tls` is false
// (then "host:port" is plain HTTP), none when it is true.
std::vector<std::string> PlaintextRemoteEndpoints(const std::vector<std::string>& endpoints,
                                                  bool tls);

// The warning for `endpoints` (PlaintextRemoteEndpoints' answer, not empty): what is exposed
// and how to close it.
std::string PlaintextEtcdWarning(const std::vector<std::string>& endpoints);

}  // namespace baton
