#include "controller/keeper/keeper_watch.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "base/log.h"
#include "base/process/pidfd.h"

namespace baton {
namespace {

constexpr const char* kLog = "keeper";

}  // namespace

std::string_view ToString(KeeperState state) {
  switch (state) {
    case KeeperState::kOff:
      return "off";
    case KeeperState::kUnavailable:
      return "unavailable";
    case KeeperState::kKeeping:
      return "keeping";
    case KeeperState::kRestarting:
      return "restarting";
  }
  return "?";
}

KeeperWatch::KeeperWatch(boost::asio::io_context& io, KeeperWatchOptions options,
                         HandOver hand_over)
    : io_(io),
      options_(std::move(options)),
      hand_over_(std::move(hand_over)),
      retry_(io),
      next_retry_(options_.first_retry) {}

KeeperWatch::~KeeperWatch() { Stop(); }

void KeeperWatch::Enter(KeeperState state, pid_t pid, std::string detail) {
  const bool changed = state != status_.state || pid != status_.pid;
  status_.state = state;
  status_.pid = pid;
  status_.detail = std::move(detail);
  if (!changed) return;
  const std::string line = "baton-keeper " + std::string(ToString(state)) +
                           (pid > 0 ? " (pid " + std::to_string(pid) + ")" : "") +
                           (status_.detail.empty() ? "" : ": " + status_.detail);
  if (state == KeeperState::kKeeping || state == KeeperState::kOff) {
    BATON_LOG(INFO, kLog) << line;
  } else {
    BATON_LOG(WARN, kLog) << line;
  }
}

void KeeperWatch::SetState(KeeperState state, std::string detail) {
  Enter(state, 0, std::move(detail));
}

void KeeperWatch::Watch(pid_t pid) {
  if (stopped_) return;
  const int fd = PidfdOpen(pid);
  if (fd < 0) {
    OnExited(pid);
    return;
  }
  pidfd_ = std::make_unique<boost::asio::posix::stream_descriptor>(io_, fd);
  Enter(KeeperState::kKeeping, pid, status_.restarts == 0 ? "" : status_.detail);
  pidfd_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                     [this, pid](const boost::system::error_code& ec) {
                       if (!ec && !stopped_) OnExited(pid);
                     });
}

void KeeperWatch::Stop() {
  stopped_ = true;
  retry_.cancel();
  if (pidfd_ != nullptr) {
    boost::system::error_code ignored;
    pidfd_->close(ignored);
    pidfd_.reset();
  }
}

bool KeeperWatch::KillAndStop() {
  const pid_t pid = status_.pid;
  bool killed = false;
  if (pidfd_ != nullptr && pid > 0) {
    killed = PidfdSendSignal(pidfd_->native_handle(), SIGKILL) == 0;
    const int error = errno;
    if (killed) {
      BATON_LOG(WARN, kLog) << "baton-keeper (pid " << pid << ") did not let the memory go when "
                            << "asked: SIGKILL sent, the memory goes with it";
    } else {
      BATON_LOG(WARN, kLog) << "baton-keeper (pid " << pid
                            << ") did not let the memory go and cannot be killed: "
                            << std::strerror(error);
    }
  }
  Stop();
  return killed;
}

void KeeperWatch::RetryFromStart(const std::string& why) {
  if (stopped_) return;
  next_retry_ = options_.first_retry;
  Retry(why);
}

void KeeperWatch::OnExited(pid_t pid) {
  if (stopped_) return;
  pidfd_.reset();
  Enter(KeeperState::kRestarting, pid,
        "it exited while keeping the memory; starting a new one and handing it the memory again");
  next_retry_ = options_.first_retry;
  Restart();
}

void KeeperWatch::Restart() {
  if (stopped_) return;
  Result<KeeperClient> keeper = KeeperClient::Connect(
      options_.socket_path, options_.binary, options_.log_path, options_.connect_wait,
      options_.unanswered_grace, options_.hung_exit_wait);
  if (!keeper.ok()) return Retry("starting baton-keeper: " + keeper.status().message());
  Result<pid_t> pid = keeper->KeeperPid();
  if (!pid.ok()) return Retry("the new baton-keeper's pid: " + pid.status().message());
  if (Status kept = hand_over_(*keeper); !kept.ok()) {
    return Retry("handing the memory to baton-keeper: " + kept.message());
  }
  ++status_.restarts;
  status_.detail = "the memory is kept again and the record rewritten";
  Watch(*pid);
}

void KeeperWatch::Retry(const std::string& why) {
  Enter(KeeperState::kUnavailable, 0,
        why + "; trying again in " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::milliseconds>(next_retry_).count()) +
            " ms");
  retry_.expires_after(next_retry_);
  next_retry_ = std::min(next_retry_ * 2, options_.max_retry);
  retry_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Restart();
  });
}

}  // namespace baton
