// UpstreamPool: idle keep-alive connections to engines, so that a request does not pay for a
// new TCP connection to its engine each time.
//
// An UpstreamCall takes an idle connection to its engine's address if one is there and puts
// it back once a response has ended cleanly with keep-alive. Connections idle longer than
// `max_idle` are dropped when met, and on every Put() for any address (an engine that is gone,
// on a port never used again, keeps none); at most `max_per_address` wait per address. Take()
// never returns a connection the engine has already closed (its FIN or reset is in: an engine
// that exited, or whose idle timeout fired), so that a request is not written into a
// connection that leads nowhere; one closed after Take() still can be, and the call then
// retries once on a fresh connection (see upstream_call.h). Forget() drops every idle
// connection to an address that refuses new ones: its engine is gone.
//
// Ownership: owns the idle streams. Thread-safe.
#pragma once

#include <boost/beast/core/tcp_stream.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"

namespace baton {

class UpstreamPool {
 public:
  using Stream = boost::beast::tcp_stream;

  UpstreamPool(const Clock& clock, size_t max_per_address = 32,
               std::chrono::milliseconds max_idle = std::chrono::seconds(30))
      : clock_(clock), max_per_address_(max_per_address), max_idle_(max_idle) {}

  // An idle connection to `address` that the engine has not closed, or null.
  std::unique_ptr<Stream> Take(const std::string& address);
  // Drops every idle connection to `address`.
  void Forget(const std::string& address);
  // Keeps `stream` for the next call to `address` (or closes it when the pool is full).
  void Put(const std::string& address, std::unique_ptr<Stream> stream);
  size_t idle() const;

 private:
  struct Idle {
    std::unique_ptr<Stream> stream;
    TimePoint since;
  };
  void DropExpired(TimePoint now) BATON_REQUIRES(mu_);
  const Clock& clock_;
  const size_t max_per_address_;
  const std::chrono::milliseconds max_idle_;
  mutable Mutex mu_;
  std::map<std::string, std::vector<Idle>> idle_ BATON_GUARDED_BY(mu_);
};

}  // namespace baton
