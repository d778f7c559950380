#include "router/upstream/upstream_pool.h"

#include <sys/socket.h>

#include <cerrno>

namespace baton {
namespace {

// Whether an idle connection can still carry a request: nothing to read (EAGAIN) is the only
// good answer. End of stream (the engine closed it), a reset, or bytes the engine sent
// unasked all mean it must not be used.
bool StillOpen(UpstreamPool::Stream& stream) {
  if (!stream.socket().is_open()) return false;
  char byte;
  const ssize_t n = ::recv(stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

std::unique_ptr<UpstreamPool::Stream> UpstreamPool::Take(const std::string& address) {
  MutexLock lock(mu_);
  auto it = idle_.find(address);
  if (it == idle_.end()) return nullptr;
  const TimePoint now = clock_.Now();
  std::unique_ptr<Stream> out;
  while (!it->second.empty() && out == nullptr) {
    Idle idle = std::move(it->second.back());
    it->second.pop_back();
    if (now - idle.since < max_idle_ && StillOpen(*idle.stream)) out = std::move(idle.stream);
  }
  if (it->second.empty()) idle_.erase(it);
  return out;
}

void UpstreamPool::Forget(const std::string& address) {
  MutexLock lock(mu_);
  idle_.erase(address);
}

void UpstreamPool::Put(const std::string& address, std::unique_ptr<Stream> stream) {
  MutexLock lock(mu_);
  DropExpired(clock_.Now());
  std::vector<Idle>& list = idle_[address];
  if (list.size() >= max_per_address_) return;  // `stream` closes as it goes
  stream->expires_never();
  list.push_back({std::move(stream), clock_.Now()});
}

void UpstreamPool::DropExpired(TimePoint now) {
  for (auto it = idle_.begin(); it != idle_.end();) {
    std::erase_if(it->second, [&](const Idle& idle) { return now - idle.since >= max_idle_; });
    it = it->second.empty() ? idle_.erase(it) : std::next(it);
  }
}

size_t UpstreamPool::idle() const {
  MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [address, list] : idle_) n += list.size();
  return n;
}

}  // namespace baton
