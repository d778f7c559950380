#include "controller/rollout/coordinator_upgrades.h"

#include <boost/asio/post.hpp>
#include <future>

namespace baton {
namespace {

// Runs `f` on the io thread and returns its result, or Unavailable after `timeout` or once
// `open` is false.
template <class T, class F>
Result<T> OnIoThread(boost::asio::io_context& io, const std::shared_ptr<std::atomic<bool>>& open,
                     std::chrono::milliseconds timeout, F f) {
  if (!*open) return Unavailable("the controller is stopping");
  auto promise = std::make_shared<std::promise<Result<T>>>();
  std::future<Result<T>> answer = promise->get_future();
  boost::asio::post(io, [open, promise, f = std::move(f)]() mutable {
    if (!*open) {
      promise->set_value(Unavailable("the controller is stopping"));
      return;
    }
    promise->set_value(f());
  });
  if (answer.wait_for(timeout) != std::future_status::ready) {
    return Unavailable("the controller's io thread did not answer in time");
  }
  return answer.get();
}

}  // namespace

CoordinatorUpgrades::CoordinatorUpgrades(boost::asio::io_context& io, Coordinator& coordinator,
                                         std::chrono::milliseconds timeout)
    : io_(io), coordinator_(coordinator), timeout_(timeout) {}

void CoordinatorUpgrades::Close() { *open_ = false; }

LocalUpgrade CoordinatorUpgrades::ViewOf(const CoordinatorStatus& s) {
  LocalUpgrade v;
  v.recovering = s.recovery.in_progress;
  if (s.upgrade.has_value()) {
    v.in_flight = true;
    v.kind = s.upgrade->kind;
    v.phase = s.upgrade->phase;
    v.command = s.upgrade->command;
  }
  v.active = s.active_command;
  if (!s.upgrade_history.empty()) {
    const UpgradeResult& last = s.upgrade_history.back();
    v.last_outcome = last.outcome;
    v.last_reason = last.reason;
    v.last_version = last.version;
  }
  return v;
}

Result<LocalUpgrade> CoordinatorUpgrades::View() {
  return OnIoThread<LocalUpgrade>(io_, open_, timeout_, [this]() -> Result<LocalUpgrade> {
    return ViewOf(coordinator_.Snapshot());
  });
}

Status CoordinatorUpgrades::StartUpgrade(UpgradeRequest request) {
  return OnIoThread<bool>(io_, open_, timeout_,
                          [this, r = std::move(request)]() mutable -> Result<bool> {
                            if (coordinator_.stopping()) {
                              return Unavailable("the controller is shutting down");
                            }
                            if (coordinator_.pair_state() != PairState::kReady) {
                              return Unavailable(std::string("the pair is ") +
                                                 ToString(coordinator_.pair_state()));
                            }
                            BATON_RETURN_IF_ERROR(coordinator_.RequestUpgrade(std::move(r)));
                            return true;
                          })
      .status();
}

Status CoordinatorUpgrades::StartRollback(UpgradeRequest overrides) {
  overrides.command.clear();
  return OnIoThread<bool>(io_, open_, timeout_,
                          [this, o = std::move(overrides)]() mutable -> Result<bool> {
                            if (coordinator_.stopping()) {
                              return Unavailable("the controller is shutting down");
                            }
                            const bool canary = coordinator_.Snapshot().upgrade.has_value();
                            if (!canary && coordinator_.pair_state() != PairState::kReady) {
                              return Unavailable(std::string("the pair is ") +
                                                 ToString(coordinator_.pair_state()));
                            }
                            BATON_RETURN_IF_ERROR(coordinator_.RequestRollback(std::move(o)));
                            return true;
                          })
      .status();
}

Status CoordinatorUpgrades::CheckCommand(const std::vector<std::string>& command) {
  return OnIoThread<bool>(io_, open_, timeout_,
                          [this, command]() -> Result<bool> {
                            BATON_RETURN_IF_ERROR(coordinator_.CheckCommand(command));
                            return true;
                          })
      .status();
}

}  // namespace baton
