#include "controller/controller.h"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>

#include "base/io/file_lock.h"
#include "base/io/private_dir.h"
#include "base/log.h"
#include "controller/ctl/ctl_service.h"
#include "controller/ctl/degradations.h"
#include "controller/rollout/rollout_programs.h"
#include "controller/upgrade/command_record.h"
#include "fleet/fleet_records.h"
#include "fleet/plaintext_etcd.h"
#include "proto/hello.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";
// What the clients' connections (batonctl, routers) may hold unsent together.
constexpr size_t kClientSendBudget = size_t{256} << 20;

int64_t Ms(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

// Logs which memory backend this controller runs on and why.
Result<BackendChoice> ChooseBackend(const ControllerConfig& c) {
  BATON_ASSIGN_OR_RETURN(BackendMode mode, ParseBackendMode(c.gpu_backend));
  BATON_ASSIGN_OR_RETURN(BackendChoice backend,
                         ChooseMemoryBackend(BackendOptions{.mode = mode, .device = c.gpu_device}));
  BATON_LOG(INFO, kLog) << backend.LogLine();
  return backend;
}

}  // namespace

Controller::Controller(boost::asio::io_context& io, ControllerConfig config, Clock& clock)
    : io_(io),
      config_(std::move(config)),
      clock_(clock),
      started_at_(clock.Now()),
      roster_file_(config_.state_dir),
      supervisor_(config_.engine_command, config_.socket_path(), config_.model_dir,
                  config_.runtime_dir, config_.engine_log_dir),
      engine_keys_(config_.engine_key_file),
      engine_logs_(io, config_.engine_log_dir, config_.engine_log_max_bytes,
                   static_cast<size_t>(config_.engine_log_keep),
                   static_cast<size_t>(config_.engine_crash_log_keep)),
      tick_(io),
      accept_retry_(io),
      router_accept_retry_(io),
      fleet_load_(io),
      cgroup_sweep_(io) {
  supervisor_.SetEngineEnvironment({{"BATON_CONTROLLER_ABSENT_TIMEOUT_MS",
                                     std::to_string(Ms(config_.controller_absent_timeout))},
                                    {"BATON_ON_CONTROLLER_ABSENT", config_.on_controller_absent}});
  supervisor_.SetHost(config_.engine_host);
  routes_.SetClock(&clock_);
  routes_.OnStalled([this](const proto::EngineStalled& s) { OnEngineStalled(s); });
}

void Controller::OnEngineStalled(const proto::EngineStalled& s) {
  if (coord_ == nullptr) return;
  if (s.streams == 0 || s.quiet_ms < proto::kMinStallQuietMs) {
    coord_->NoteRefusal("router " + s.router,
                        "EngineStalled for engine " + std::to_string(s.engine_id) + " with " +
                            std::to_string(s.streams) + " streams quiet for " +
                            std::to_string(s.quiet_ms) + " ms: no evidence of a hang (a stall " +
                            "is at least one stream quiet for " +
                            std::to_string(proto::kMinStallQuietMs) + " ms); not fenced");
    return;
  }
  // A success is stamped when the report that shows it arrives, up to kReportLag after it
  // happened: without the allowance, one just before the streams went quiet would look as
  // recent as the stall at every report, and the stall would be doubted for ever.
  constexpr auto kReportLag = std::chrono::milliseconds(500);
  const std::optional<TimePoint> answered = routes_.LastSuccess(s.engine_id);
  if (answered.has_value() &&
      clock_.Now() - *answered + kReportLag < std::chrono::milliseconds(s.quiet_ms)) {
    TimePoint& logged = stall_doubted_[s.engine_id];
    if (clock_.Now() - logged >= std::chrono::seconds(10)) {
      logged = clock_.Now();
      BATON_LOG(INFO, kLog) << "engine " << s.engine_id << ": router " << s.router
                            << " finds its streams stalled for " << s.quiet_ms
                            << " ms, but it answered a request " << Ms(clock_.Now() - *answered)
                            << " ms ago: not fenced";
    }
    return;
  }
  coord_->OnEngineStalled(s.engine_id, "no byte on its " + std::to_string(s.streams) +
                                           " answering streams for " + std::to_string(s.quiet_ms) +
                                           " ms (router " + s.router + ")");
  ArmTick();
}

Controller::~Controller() {
  // Their threads post to the io thread: stopped first.
  if (local_upgrades_ != nullptr) local_upgrades_->Close();
  rollout_.reset();
  fleet_reports_.reset();
  coord_.reset();
  for (auto& [id, h] : handles_) h.process.KillAndReap();
}

Status Controller::LoadEngineKeys() {
  BATON_RETURN_IF_ERROR(engine_keys_.Load());
  if (engine_keys_.keys() != 0) {
    BATON_LOG(INFO, kLog) << "engine key file " << engine_keys_.path() << ": "
                          << engine_keys_.keys() << " keys; engines serve only the requests "
                          << "that carry one";
  } else if (!IsLoopbackHost(config_.engine_host)) {
    BATON_LOG(WARN, kLog) << EnginesOpenWarning(config_.engine_host);
  }
  return OkStatus();
}

Status Controller::StartFleetReports() {
  if (fleet_ == nullptr) return OkStatus();
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd,
                         EtcdClient::Create(FleetMember::EtcdOptionsOf(config_)));
  fleet_reports_ = std::make_unique<FleetReportReader>(
      std::move(etcd), FleetReportsPrefix(config_.fleet_prefix, config_.fleet_node),
      [this](proto::RouterReport report, std::vector<proto::EngineStalled> stalls) {
        boost::asio::post(io_, [this, r = std::move(report), s = std::move(stalls)]() mutable {
          routes_.StoreFleetReport(std::move(r));  // first: it may show a recent answer
          for (proto::EngineStalled& stall : s) {
            stall.router = "fleet " + stall.router;  // as its report is kept
            OnEngineStalled(stall);
          }
        });
      });
  return OkStatus();
}

Status Controller::StartFleetRollout() {
  if (fleet_ == nullptr) return OkStatus();
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd,
                         EtcdClient::Create(FleetMember::EtcdOptionsOf(config_)));
  local_upgrades_ = std::make_unique<CoordinatorUpgrades>(io_, *coord_);
  // The supervisor is not changed once the controller runs: read from the rollout's thread.
  auto allow = [this](const std::vector<std::string>& command) -> Status {
    BATON_ASSIGN_OR_RETURN(std::string program, supervisor_.ProgramOf(command));
    Result<std::string> engine = supervisor_.ProgramOf({});
    return CheckRolloutProgram(program, engine.ok() ? *engine : std::string(),
                               config_.fleet_rollout_programs);
  };
  rollout_ = std::make_unique<FleetRollout>(std::move(etcd),
                                            FleetRolloutOptions{.prefix = config_.fleet_prefix,
                                                                .node = config_.fleet_node,
                                                                .allow_command = std::move(allow)},
                                            local_upgrades_.get());
  return OkStatus();
}

Result<std::unique_ptr<Controller>> Controller::Create(boost::asio::io_context& io,
                                                       ControllerConfig config, Clock& clock) {
  std::unique_ptr<Controller> c(new Controller(io, std::move(config), clock));
  if (Status started = c->Init(); !started.ok()) {
    c->LeaveAsFound(started);
    return started;
  }
  return c;
}

Status Controller::Init() {
  BATON_RETURN_IF_ERROR(LoadEngineKeys());
  BATON_RETURN_IF_ERROR(
      EnsurePrivateDir(config_.runtime_dir, "runtime directory", "controller.runtime_dir"));
  // Before anything of the runtime directory (its cgroups, its keeper, its socket) or the
  // state directory is touched: a second controller started by mistake leaves the running
  // one's engines, memory and cgroups alone.
  BATON_ASSIGN_OR_RETURN(runtime_lock_,
                         LockFile(config_.lock_path(), "runtime directory " + config_.runtime_dir));
  BATON_RETURN_IF_ERROR(
      EnsurePrivateDir(config_.state_dir, "state directory", "controller.state_dir"));
  if (!config_.engine_log_dir.empty()) {
    BATON_RETURN_IF_ERROR(
        EnsurePrivateDir(config_.engine_log_dir, "engine log directory", "engine.log_dir"));
  }
  BATON_ASSIGN_OR_RETURN(EpochJournal journal,
                         EpochJournal::Open(config_.journal_path(), config_.epoch_reserve));
  journal_.emplace(std::move(journal));
  BATON_LOG(INFO, kLog) << "epoch journal " << journal_->path() << " at epoch "
                        << journal_->current();
  BATON_ASSIGN_OR_RETURN(cgroups_, EngineCgroups::Open(config_.engine_cgroup, config_.runtime_dir,
                                                       &cgroups_off_reason_));
  if (cgroups_ != nullptr) {
    BATON_LOG(INFO, kLog) << "engine cgroups under " << cgroups_->base()
                          << ": a fence kills every process an engine started";
  } else if (config_.engine_cgroup == "off") {
    cgroups_off_reason_ = "engine.cgroup is \"off\"";
  } else {
    BATON_LOG(WARN, kLog) << "engine cgroups unavailable (" << cgroups_off_reason_
                          << "): a fence kills each engine's process group only";
  }
  BATON_ASSIGN_OR_RETURN(BackendChoice backend, ChooseBackend(config_));
  Result<std::optional<CommandRecord>> commands = LoadCommandRecord(config_.command_record_path());
  if (commands.ok()) {
    found_.commands = *commands;
  } else {
    found_.commands_error = commands.status().message();
  }
  FindPrevious();
  BATON_RETURN_IF_ERROR(SetUpMemory(backend, *ParseBackendMode(config_.gpu_backend)));
  BATON_ASSIGN_OR_RETURN(fleet_, FleetMember::Create(config_, FleetFacts()));
  BATON_RETURN_IF_ERROR(StartFleetReports());
  coord_ = std::make_unique<Coordinator>(config_, clock_, *journal_, static_cast<Effects&>(*this));
  BATON_RETURN_IF_ERROR(StartFleetRollout());

  // Sends never block the io thread: a peer that stops reading falls behind in its own queue
  // and is dropped once it takes nothing for a second or is a frame limit behind. Clients
  // (batonctl, routers) also share one budget, so many of them cannot make the controller
  // hold a frame limit each; engines are taken off it once they are known (AttachEngine).
  client_send_budget_ = std::make_shared<proto::SendBudget>(kClientSendBudget);
  proto::ChannelOptions copts{.max_send_frame_size = proto::kControllerMaxFrameSize,
                              .send_timeout = std::chrono::seconds(1),
                              .max_queued_send_bytes = proto::kControllerMaxFrameSize,
                              .send_budget = client_send_budget_,
                              .label = "peer",
                              .clock = &clock_};
  BATON_ASSIGN_OR_RETURN(proto::Listener listener,
                         proto::Listener::Bind(io_, config_.socket_path(), copts));
  listener_.emplace(std::move(listener));
  return BindRouterSocket(copts);
}

void Controller::Start() {
  BATON_LOG(INFO, kLog) << "listening on " << config_.socket_path()
                        << "; engine command: " << config_.engine_command.front();
  for (auto& [id, h] : handles_) {
    if (h.process.pid() != 0) WatchPid(id);
  }
  Accept(false);
  if (router_listener_.has_value()) Accept(true);
  StartKeeperWatch();
  coord_->Start(found_);
  ArmTick();
  ArmFleetLoad();
  engine_logs_.Start();
}

void Controller::Shutdown(std::function<void()> done) {
  if (stopping_) return;
  stopping_ = true;
  stop_done_ = std::move(done);
  BATON_LOG(INFO, kLog) << "shutting down: stopping " << coord_->Remaining().size()
                        << " engines (grace " << Ms(config_.stop_grace) << " ms)";
  tick_.cancel();
  accept_retry_.cancel();
  router_accept_retry_.cancel();
  fleet_load_.cancel();
  if (listener_.has_value()) listener_->Close();
  if (router_listener_.has_value()) router_listener_->Close();
  coord_->BeginShutdown();
  stop_timer_ = std::make_shared<boost::asio::steady_timer>(io_);
  stop_timer_->expires_after(coord_->Remaining().empty() ? Duration::zero() : config_.stop_grace);
  // Runs at the end of the grace, or at once when the last engine has exited (cancel).
  stop_timer_->async_wait([this](const boost::system::error_code&) { FinishShutdown(); });
}

void Controller::FinishShutdown() {
  if (!stop_done_) return;
  for (EngineId id : coord_->Remaining()) {
    EngineHandle* h = Handle(id);
    if (h == nullptr) {
      coord_->OnExited(id, "never started");
      continue;
    }
    Result<std::optional<ExitInfo>> exited = h->process.TryReap();
    if (exited.ok() && exited->has_value()) {  // exited just before its pidfd wakeup ran
      coord_->OnExited(id, (*exited)->ToString());
      continue;
    }
    h->process.KillAndReap();
    BATON_LOG(WARN, kLog) << "engine " << id << " (pid " << h->pid << ") still running "
                          << Ms(config_.stop_grace) << " ms after Stop: SIGKILL sent; "
                          << h->process.exit_info()->ToString();
    coord_->OnExited(id, h->process.exit_info()->ToString());
  }
  conns_.clear();
  listener_.reset();
  router_listener_.reset();
  // A clean stop leaves nothing for a successor: a keeper that will not let go is killed.
  const bool released = ReleaseKeptMemory();
  if (keeper_watch_ != nullptr) {
    if (released) {
      keeper_watch_->Stop();  // its exit is no death
    } else {
      keeper_watch_->KillAndStop();
    }
  }
  BATON_LOG(INFO, kLog) << "engines stopped at epoch " << journal_->current();
  std::function<void()> done = std::move(stop_done_);
  stop_done_ = nullptr;
  done();
}

void Controller::HandOver(const std::string& why) {
  BATON_LOG(WARN, kLog) << "handing over to the next controller (" << why
                        << "): " << handles_.size()
                        << " engines, the weights and the pool stay; exiting now";
  // As a crash would: no destructor runs, so nothing is killed or unmapped.
  std::_Exit(0);
}

// --- timer --------------------------------------------------------------------------------------

void Controller::ArmTick() {
  if (stopping_) return;
  const TimePoint now = clock_.Now();
  const TimePoint when = coord_->NextWakeup();
  // A pending tick no later than `when` stays, even one already due whose handler has not run:
  // moving it later would let messages that arrive as it falls due put it off for good.
  if (tick_at_.has_value() && *tick_at_ <= when) return;
  tick_at_ = when;
  tick_.expires_after(std::max(Duration::zero(), when - now));
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    tick_at_.reset();
    OnTick();
  });
}

void Controller::OnTick() {
  coord_->OnTick();
  CloseIdleConnections();
  ArmTick();
}

}  // namespace baton
