// RouterOptions: everything `baton-router` is told, from a TOML file (a [router] table) and/or
// command-line flags (flags override the file).
//
// ParseRouterToml() and ParseRouterFlags() refuse unknown keys, wrong types and out-of-range
// values with an error that names the key or flag. docs/router.md lists every key.
// Plain values; thread-compatible.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace baton {

struct RouterOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 8000;
  std::string controller_socket;  // default <runtime dir>/controller.sock
  std::string backend;            // "HOST:PORT": a static primary, no controller
  std::string api_key;            // empty: no authentication
  // The engine key file (proto/http/engine_key.h): its first key goes to engines as
  // `Authorization: Bearer KEY`, read again on SIGHUP. Empty: no key sent.
  std::string engine_key_file;
  size_t max_body_bytes = 8u << 20;
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds first_byte_timeout{60000};   // request sent → response header
  std::chrono::milliseconds stream_idle_timeout{60000};  // between two body reads
  // An engine whose every stream that had begun answering sent nothing for this long is
  // reported stalled to the controller (proto::EngineStalled), which fences it as hung.
  // 0: never reported.
  std::chrono::milliseconds stall_timeout{30000};
  // An engine no route table has listed for this long, with no request in flight on it, is
  // forgotten: its outcome counters leave the RouterReport and /metrics (EngineOutcomes).
  // 0: never.
  std::chrono::milliseconds engine_retention{600000};
  std::chrono::milliseconds resubscribe_max_backoff{2000};
  int threads = 2;
  // Client-side limits.
  size_t max_connections = 4096;                          // more get 503 and are closed
  uint32_t max_header_bytes = 16u << 10;                  // 431 past it
  std::chrono::milliseconds request_timeout{30000};       // first byte of a request to its end: 408
  std::chrono::milliseconds client_idle_timeout{120000};  // keep-alive wait for a request
  // Admission (see admission.h).
  size_t max_queue = 1024;
  std::chrono::milliseconds max_queue_wait{5000};
  std::vector<double> ramp_steps{0.3, 0.6, 1.0};
  std::chrono::milliseconds ramp_duration{2000};
  int migration_limit = 3;
  // Canary output agreement (shadow_comparer.h): compare 1 of every N reproducible canary
  // answers with the primary's; 0: never.
  int shadow_every = 1;
  // The fleet (docs/fleet.md, Routers): with etcd set, the router routes across every node
  // registered under `etcd_prefix` instead of following one controller.
  std::vector<std::string> etcd;  // member endpoints: "host:port", "http://" or "https://"
  std::string etcd_prefix = "/baton/";
  std::chrono::milliseconds etcd_timeout{1000};  // per request, per member
  // TLS to etcd (docs/fleet.md, Security): with a CA file every member is reached over https;
  // the client certificate and its key are set together, or neither.
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
  std::chrono::milliseconds fleet_poll{100};  // how often the node records are read
  std::chrono::milliseconds fleet_suspect{
      1000};                      // new requests pass over a node a replay failed on
  std::string fleet_router_name;  // in its report keys; default <host>-<pid>
  // Stopping (SIGTERM): for drain_delay the router still accepts connections while /health
  // says draining (a load balancer's time to notice), then it stops accepting and waits up
  // to drain_timeout for the requests in flight.
  std::chrono::milliseconds drain_delay{0};
  std::chrono::milliseconds drain_timeout{30000};
};

// $BATON_RUNTIME_DIR, or /tmp/baton-<uid>.
std::string RouterDefaultRuntimeDir();

// Applies the [router] table of a TOML document to `options`.
Status ParseRouterToml(const std::string& text, const std::string& source, RouterOptions* options);

// Parses argv (after argv[0]); --config FILE is read first, other flags override it.
Result<RouterOptions> ParseRouterFlags(const std::vector<std::string>& args);

// "HOST:PORT" with a numeric port; InvalidArgument naming `what` otherwise.
Status SplitHostPort(const std::string& text, const std::string& what, std::string* host,
                     uint16_t* port);

}  // namespace baton
