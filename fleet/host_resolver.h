// HostResolver: one endpoint's host name resolved with a bound on the wait.
//
// getaddrinfo cannot be cancelled, and a name server that does not answer holds its caller for
// its own retries (resolv.conf's timeout x attempts x servers: 30 s and more by default), far
// past the timeout of the call that needed the address (an etcd lease renewal). Resolve() runs
// the lookup on a thread of its own and waits at most `timeout`: DeadlineExceeded when the
// answer is late. A lookup still running when the next Resolve() comes is waited for again,
// never started twice, so at most one thread per resolver is ever held in getaddrinfo; its
// answer, when it comes, serves that next call. A numeric host (an IPv4 or IPv6 address) is
// not looked up at all.
//
// Ownership: the lookup's thread shares its state with the resolver and outlives it when it
// is still held at destruction (detached; it ends with getaddrinfo). Thread: one caller at a
// time (as JsonHttpClient).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace baton {

class HostResolver {
 public:
  using Endpoints = std::vector<boost::asio::ip::tcp::endpoint>;
  // How a host name is looked up; the default asks the system (getaddrinfo).
  using Lookup = std::function<Result<Endpoints>(const std::string& host, const std::string& port)>;

  HostResolver(std::string host, std::string port, Lookup lookup = {});
  ~HostResolver();
  HostResolver(const HostResolver&) = delete;
  HostResolver& operator=(const HostResolver&) = delete;

  Result<Endpoints> Resolve(std::chrono::milliseconds timeout);
  // Lookups started (not counting numeric hosts): for tests and logs.
  uint64_t lookups() const { return lookups_; }

  static Result<Endpoints> SystemLookup(const std::string& host, const std::string& port);

 private:
  struct Pending;

  const std::string host_, port_;
  const Lookup lookup_;
  std::shared_ptr<Pending> pending_;  // the lookup running or not yet taken; null when none
  uint64_t lookups_ = 0;
};

}  // namespace baton
