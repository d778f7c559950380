// SendBudget: a byte limit on what several queued-mode channels (ChannelOptions::send_budget)
// hold in their send queues together, so that many peers that stop reading cannot make a
// daemon buffer max_queued_send_bytes each without bound.
//
// A channel takes from the budget what it queues and gives it back as the bytes go out or
// when it closes; a frame that would pass the limit is refused and that channel closed
// (Channel::Send says why). Shared by the channels (shared_ptr). Thread: the channels' io
// thread only (not synchronized).
#pragma once

#include <algorithm>
#include <cstddef>

namespace baton::proto {

class SendBudget {
 public:
  explicit SendBudget(size_t limit) : limit_(limit) {}

  // Takes `bytes` if they fit under the limit.
  bool TryTake(size_t bytes) {
    if (bytes > limit_ - used_) return false;
    used_ += bytes;
    return true;
  }
  void Give(size_t bytes) { used_ -= std::min(used_, bytes); }

  size_t used() const { return used_; }
  size_t limit() const { return limit_; }

 private:
  size_t limit_;
  size_t used_ = 0;
};

}  // namespace baton::proto
