#include "fleet/host_resolver.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <charconv>
#include <thread>
#include <utility>

#include "base/mutex.h"

namespace baton {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// What the lookup's thread hands over.
struct HostResolver::Pending {
  Mutex mu;
  CondVar done_cv;
  bool done BATON_GUARDED_BY(mu) = false;
  Result<Endpoints> answer BATON_GUARDED_BY(mu) = Unavailable("not resolved yet");
};

HostResolver::HostResolver(std::string host, std::string port, Lookup lookup)
    : host_(std::move(host)),
      port_(std::move(port)),
      lookup_(lookup ? std::move(lookup) : Lookup(&HostResolver::SystemLookup)) {}

HostResolver::~HostResolver() = default;

Result<HostResolver::Endpoints> HostResolver::SystemLookup(const std::string& host,
                                                           const std::string& port) {
  asio::io_context io;
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  const auto results = resolver.resolve(host, port, ec);
  if (ec) return Unavailable("resolve " + host + ": " + ec.message());
  Endpoints out;
  for (const auto& r : results) out.push_back(r.endpoint());
  if (out.empty()) return Unavailable("resolve " + host + ": no address");
  return out;
}

Result<HostResolver::Endpoints> HostResolver::Resolve(std::chrono::milliseconds timeout) {
  boost::system::error_code ec;
  const asio::ip::address numeric = asio::ip::make_address(host_, ec);
  if (!ec) {
    uint16_t port = 0;
    const auto [end, bad] = std::from_chars(port_.data(), port_.data() + port_.size(), port);
    if (bad != std::errc() || end != port_.data() + port_.size()) {
      return InvalidArgument("resolve " + host_ + ": port '" + port_ + "' is not a port");
    }
    return Endpoints{tcp::endpoint(numeric, port)};
  }
  if (pending_ == nullptr) {
    pending_ = std::make_shared<Pending>();
    ++lookups_;
    std::thread([p = pending_, lookup = lookup_, host = host_, port = port_] {
      Result<Endpoints> answer = lookup(host, port);
      MutexLock lock(p->mu);
      p->answer = std::move(answer);
      p->done = true;
      p->done_cv.NotifyAll();
    }).detach();
  }
  std::shared_ptr<Pending> p = pending_;
  MutexLock lock(p->mu);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!p->done) {
    if (p->done_cv.WaitUntil(p->mu, deadline) == std::cv_status::timeout) break;
  }
  if (!p->done) {
    return DeadlineExceeded("resolve " + host_ + ": no answer within " +
                            std::to_string(timeout.count()) +
                            " ms (the name server is slow or unreachable)");
  }
  pending_.reset();
  return std::move(p->answer);
}

}  // namespace baton
