// CoordinatorUpgrades: the node's own upgrades (LocalUpgrades, fleet_rollout.h) as the
// Coordinator runs them. Each call is posted to the controller's io thread, where the
// Coordinator lives, and waits for its answer (at most `timeout`: Unavailable after it, or
// once Close() was called), so the rollout's thread never touches the Coordinator itself.
//
// Ownership: borrows the io_context and the Coordinator, which must outlive every call;
// Close() (from any thread) makes later calls and the ones waiting return Unavailable.
// Thread: any but the io thread (a call from it would wait for itself).
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>

#include "controller/core/coordinator.h"
#include "controller/rollout/fleet_rollout.h"

namespace baton {

class CoordinatorUpgrades final : public LocalUpgrades {
 public:
  CoordinatorUpgrades(boost::asio::io_context& io, Coordinator& coordinator,
                      std::chrono::milliseconds timeout = std::chrono::seconds(5));

  Result<LocalUpgrade> View() override;
  // Unavailable while the pair is not ready for one (it may be relaunching its standby).
  Status StartUpgrade(UpgradeRequest request) override;
  Status StartRollback(UpgradeRequest overrides) override;
  Status CheckCommand(const std::vector<std::string>& command) override;
  void Close();

  // What View() reports of `status` (public for tests).
  static LocalUpgrade ViewOf(const CoordinatorStatus& status);

 private:
  boost::asio::io_context& io_;
  Coordinator& coordinator_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace baton
