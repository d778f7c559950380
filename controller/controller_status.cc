// Controller: its whole status as one copy (controller_status.h).
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "controller/controller.h"

namespace baton {
namespace {

// Bytes of [data, data + size) resident in memory now (mincore), or -1 if unknown.
int64_t ResidentBytes(const uint8_t* data, uint64_t size) {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (data == nullptr || size == 0) return 0;
  std::vector<unsigned char> pages((size + page - 1) / page);
  if (::mincore(const_cast<uint8_t*>(data), size, pages.data()) != 0) return -1;
  uint64_t resident = 0;
  for (unsigned char p : pages) resident += (p & 1) != 0 ? page : 0;
  return static_cast<int64_t>(std::min(resident, size));
}

}  // namespace

// A locked arena is resident whole. Otherwise mincore tells, but over a large arena of 4 KiB
// pages (a million entries, each looked up in the page cache when this process has not
// faulted it: an adopted arena) it would hold the io thread for about 100 ms: not counted
// there (-1). At most every 2 s, so that a client polling status costs nothing.
int64_t Controller::Resident(const PinnedArena& a) const {
  if (a.locked()) return static_cast<int64_t>(a.size());
  if (a.small_bytes() > (uint64_t{1} << 30)) return -1;
  const TimePoint now = clock_.Now();
  if (resident_bytes_ < 0 || now - resident_at_ >= std::chrono::seconds(2)) {
    resident_bytes_ = ResidentBytes(a.data(), a.size());
    resident_at_ = now;
  }
  return resident_bytes_;
}

ControllerStatus Controller::Snapshot() const {
  ControllerStatus s;
  s.core = coord_->Snapshot();
  s.config = &config_;
  s.pid = ::getpid();
  s.started_at = started_at_;
  s.restarts = found_.incarnation > 0 ? found_.incarnation - 1 : 0;
  const PinnedArena& a = weights_->arena();
  s.weights = WeightsStatus{.model_dir = weights_->dir(),
                            .tensors = weights_->tensors().size(),
                            .tensor_bytes = weights_->tensor_bytes(),
                            .arena_bytes = a.size(),
                            .resident_bytes = Resident(a),
                            .huge_pages = a.huge_pages(),
                            .huge_bytes = a.huge_bytes(),
                            .small_bytes = a.small_bytes(),
                            .numa_node = a.numa_node(),
                            .numa_bound = a.numa_bound(),
                            .numa_source = a.numa_source(),
                            .locked = a.locked(),
                            .lock_pending = a.lock_pending(),
                            .load_method = weights_->load_stats().method,
                            .load_s = weights_->load_stats().seconds,
                            .load_gbps = weights_->load_stats().gbps,
                            .bytes_read = weights_->load_stats().bytes,
                            .warnings = a.warnings(),
                            .files_differ = weights_files_};
  s.pool = PoolStatus{.bytes = pool_.size(),
                      .huge_pages = pool_.huge_pages(),
                      .huge_pages_fallback = pool_.fallback_reason(),
                      .adopted = pool_adopted_};
  s.journal = JournalStatus{.durable = journal_->current(),
                            .reserved = journal_->reserved(),
                            .reserve_batch = journal_->reserve_batch(),
                            .last_write = journal_->last_write(),
                            .write_failures = journal_->write_failures()};
  s.device.present = device_ != nullptr;
  s.device.nvml_lists_engines = nvml_lists_engines_;
  s.device.adopted = device_ != nullptr && device_adopted_;
  s.device.made_anew = device_why_;
  if (device_ != nullptr) {
    s.device.device = device_->device();
    s.device.describe = device_->Describe();
    s.device.stats = device_->stats();
  }
  if (cgroups_ != nullptr) {
    s.cgroup_base = cgroups_->base();
    s.leftovers_killed = cgroups_->leftovers_killed();
    s.cgroups_awaiting_removal = cgroups_->retired().pending();
  }
  s.cgroups_off_reason = cgroups_off_reason_;
  for (const auto& [id, h] : handles_) {
    if (h.liveness != nullptr) s.liveness_watched.insert(id);
    if (h.cgroup == nullptr) continue;
    s.engine_cgroups[id] = h.cgroup->path();
    s.engine_cpu_s[id] = h.cgroup->CpuSeconds();
  }
  s.routes = routes_.current();
  s.route_subscribers = routes_.subscriber_count();
  s.client_send_queued_bytes = client_send_budget_ != nullptr ? client_send_budget_->used() : 0;
  if (keeper_watch_ != nullptr) {
    s.keeper = keeper_watch_->status();
  } else {
    s.keeper.state = config_.keep_memory ? KeeperState::kUnavailable : KeeperState::kOff;
    s.keeper.detail = keeper_state_;
  }
  if (fleet_ != nullptr) {
    s.fleet_key = fleet_->key();
    s.fleet = fleet_->state();
  }
  if (rollout_ != nullptr) s.rollout = rollout_->snapshot();
  return s;
}

void Controller::ScheduleHandOver(const std::string& why) {
  // The reply to batonctl goes first; a moment later the process exits.
  auto timer = std::make_shared<boost::asio::steady_timer>(io_, std::chrono::milliseconds(50));
  timer->async_wait([this, timer, why](const boost::system::error_code&) { HandOver(why); });
}

}  // namespace baton
