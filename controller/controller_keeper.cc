// Controller: baton-keeper's death (controller/keeper/keeper_watch.h). The keeper that
// start-up handed the memory to is watched; when it dies, a new one is started and given the
// memory again from the fds this controller holds: the weight arena and the pool (new
// generations in their manifests) and, on the CUDA backend, the device memory's chunks, then
// the memory record is rewritten, so that a later controller restart adopts everything as
// before. The engines see nothing of it: their mappings never depended on the keeper.
#include "base/log.h"
#include "controller/controller.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";

}  // namespace

void Controller::StartKeeperWatch() {
  keeper_watch_ = std::make_unique<KeeperWatch>(
      io_,
      KeeperWatchOptions{.socket_path = config_.keeper_socket_path(),
                         .binary = KeeperClient::DefaultBinary(),
                         .log_path = config_.runtime_dir + "/keeper.log"},
      [this](KeeperClient& keeper) { return HandMemoryTo(keeper); });
  if (!config_.keep_memory) {
    keeper_watch_->SetState(KeeperState::kOff, keeper_state_);
  } else if (keeper_pid_ <= 0 && !KeeperClient::DefaultBinary().empty()) {
    // None could be had at start (one was hung, or would not start): tried again, so that a
    // later restart finds the memory kept.
    keeper_watch_->RetryFromStart(keeper_state_);
  } else if (keeper_pid_ <= 0 || memory_record_.weights_generation == 0 ||
             memory_record_.pool_generation == 0) {
    keeper_watch_->SetState(KeeperState::kUnavailable, keeper_state_ == "kept"
                                                           ? "the memory could not be kept"
                                                           : keeper_state_);
  } else {
    keeper_watch_->Watch(keeper_pid_);
  }
}

Status Controller::HandMemoryTo(KeeperClient& keeper) {
  KeepMemory(keeper, /*weights_adopted=*/false, /*pool_adopted=*/false, &memory_record_);
  if (memory_record_.weights_generation == 0 || memory_record_.pool_generation == 0) {
    return Internal("the weights or the pool were not kept (see the log above)");
  }
  if (device_ != nullptr) {
    memory_record_.device_generation = 0;  // the dead keeper's device parts are gone with it
    KeepDevice(keeper);
  }
  BATON_LOG(INFO, kLog) << "the memory is kept again by baton-keeper: weights and pool"
                        << (memory_record_.device_generation != 0 ? " and device memory" : "")
                        << "; the memory record names the new generations";
  return OkStatus();
}

}  // namespace baton
