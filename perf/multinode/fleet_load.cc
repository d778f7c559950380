#include "perf/multinode/fleet_load.h"

#include <algorithm>

#include "perf/load/load_client.h"

namespace baton::perf {

FleetLoad::FleetLoad(std::vector<std::string> routers, std::vector<LoadRequest> requests,
                     int clients)
    : routers_(std::move(routers)),
      requests_(std::move(requests)),
      clients_(clients),
      origin_(std::chrono::steady_clock::now()) {}

double FleetLoad::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
}

void FleetLoad::Start() {
  for (int c = 0; c < clients_; ++c) threads_.emplace_back([this, c] { Client(c); });
}

void FleetLoad::Stop() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

std::vector<FleetSample> FleetLoad::Samples() {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_;
}

void FleetLoad::Client(int c) {
  const int router = c % static_cast<int>(routers_.size());
  LoadClient client(routers_[router]);
  std::vector<FleetSample> mine;
  while (!stop_) {
    FleetSample s;
    s.request = next_++ % static_cast<int>(requests_.size());
    s.router = router;
    const LoadRequest& r = requests_[s.request];
    s.sent_s = Now();
    const LoadReply reply =
        client.Post(r.path, r.body, nullptr, [&](std::string_view) { s.chunk_s.push_back(Now()); });
    s.end_s = Now();
    s.entry.invoked = true;
    s.entry.sent_s = s.sent_s;
    s.entry.end_s = s.end_s;
    Classify(reply, r.stream, &s.entry);
    mine.push_back(std::move(s));
  }
  std::lock_guard<std::mutex> lock(mu_);
  samples_.insert(samples_.end(), std::make_move_iterator(mine.begin()),
                  std::make_move_iterator(mine.end()));
}

double GapAfter(const FleetSample& s, double at_s) {
  if (s.end_s <= at_s) return -1;
  const double from = std::max(at_s, s.sent_s);
  const auto next = std::lower_bound(s.chunk_s.begin(), s.chunk_s.end(), from);
  return (next == s.chunk_s.end() ? s.end_s : *next) - from;
}

}  // namespace baton::perf
