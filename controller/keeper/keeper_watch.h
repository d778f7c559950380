// KeeperWatch: the controller's watch over baton-keeper (memory_keeper.h). The keeper is
// started detached so that it outlives the controller; it may still die (kill -9, the OOM
// killer). The controller holds every fd the keeper held (the weight arena's, the pool's, on
// the CUDA backend the device chunks'), so nothing is lost yet, but a later controller restart
// would find nothing to adopt. The watch holds a pidfd on the keeper; when it becomes
// readable the watch starts a new keeper (KeeperClient::Connect) and calls `hand_over`, which
// keeps the memory in it again and rewrites the memory record; a keeper that cannot be
// started or will not keep is tried again after 1 s, doubling to 30 s. One log line per state
// change.
//
// States: kOff (memory not kept: controller.keep_memory = false), kUnavailable (no keeper
// keeps the memory now; `detail` says why), kKeeping (a keeper, `pid`, keeps it),
// kRestarting (the keeper died; a new one is being started). `restarts` counts the keepers
// started after a death.
//
// Thread: the controller's io_context thread (the callbacks run there; `hand_over` may block
// briefly on the keeper's socket, as at start-up).
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"
#include "controller/keeper/keeper_client.h"

namespace baton {

enum class KeeperState { kOff, kUnavailable, kKeeping, kRestarting };
std::string_view ToString(KeeperState state);

struct KeeperStatus {
  KeeperState state = KeeperState::kOff;
  pid_t pid = 0;
  uint64_t restarts = 0;
  std::string detail;  // why it is off or unavailable, or what the last restart did
};

struct KeeperWatchOptions {
  std::string socket_path;
  std::string binary;  // baton-keeper to start ("" : none is started)
  std::string log_path;
  // How long a keeper just started may take to answer: the watch runs on the controller's
  // io thread, which must not stall for its watchdog's 3 s (one that takes longer is tried
  // again at the next retry).
  Duration connect_wait = std::chrono::milliseconds(300);
  // How long a keeper found at the socket that accepts but does not answer gets before it is
  // killed (KeeperClient::Connect): its first try's second only, for the same watchdog, not
  // the grace of a controller's start (the keeper that kept the memory is dead by then).
  Duration unanswered_grace = std::chrono::seconds(1);
  // How long such a keeper, killed, may take to be gone: with the grace and connect_wait, the
  // watch stays within the watchdog's 3 s.
  Duration hung_exit_wait = std::chrono::milliseconds(500);
  Duration first_retry = std::chrono::seconds(1);
  Duration max_retry = std::chrono::seconds(30);
};

class KeeperWatch {
 public:
  // Gives the memory to a freshly started keeper and records it; an error when it did not.
  using HandOver = std::function<Status(KeeperClient&)>;

  KeeperWatch(boost::asio::io_context& io, KeeperWatchOptions options, HandOver hand_over);
  ~KeeperWatch();
  KeeperWatch(const KeeperWatch&) = delete;
  KeeperWatch& operator=(const KeeperWatch&) = delete;

  // The keeper `pid` keeps the memory now: watch it. When its pidfd cannot be had (it is gone
  // already), it is handled as a death.
  void Watch(pid_t pid);
  // At start-up, when no keeper keeps the memory: the state and why (nothing is retried).
  void SetState(KeeperState state, std::string detail);
  // At start-up, when no keeper could be had: kUnavailable with `why`, and a keeper is
  // started (and handed the memory) again after 1 s, doubling to 30 s, as after a death.
  void RetryFromStart(const std::string& why);
  // Before a clean stop lets the keeper go: its exit is no longer a death.
  void Stop();
  // At a clean stop, when the keeper did not let the memory go when asked (its socket gone,
  // or it does not answer): SIGKILL through the pidfd, so that no keeper holds the memory for
  // nobody; then Stop(). Whether SIGKILL was sent (false: no keeper watched, or the signal
  // failed, which is logged).
  bool KillAndStop();

  const KeeperStatus& status() const { return status_; }

 private:
  void OnExited(pid_t pid);
  void Restart();
  void Retry(const std::string& why);
  void Enter(KeeperState state, pid_t pid, std::string detail);

  boost::asio::io_context& io_;
  KeeperWatchOptions options_;
  HandOver hand_over_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> pidfd_;
  boost::asio::steady_timer retry_;
  Duration next_retry_;
  bool stopped_ = false;
  KeeperStatus status_;
};

}  // namespace baton
