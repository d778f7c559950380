#include "controller/controller.h"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "base/log.h"
#include "controller/ctl/ctl_service.h"
#include "cuda/driver/gpu_backend.h"
#include "proto/hello.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";
constexpr Duration kHelloTimeout = std::chrono::seconds(5);
constexpr Duration kMaxTickInterval = std::chrono::milliseconds(250);
// How often the barrier asks NVML whether a reaped holder's GPU context is gone.
constexpr Duration kGpuReleasePoll = std::chrono::milliseconds(1);
constexpr size_t kKeepRefusals = 20;
// What the clients' connections may hold unsent together (proto/transport/send_budget.h).
constexpr size_t kClientSendBudget = size_t{256} << 20;

Status MakeDir(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status(StatusCode::kIoError, "creating directory " + path + ": " + ec.message());
  ::chmod(path.c_str(), 0700);
  return OkStatus();
}

int64_t Ms(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

CrashLoopGuard::Options GuardOptions(const ControllerConfig& c) {
  CrashLoopGuard::Options o;
  o.max_failures = c.crash_max_failures;
  o.window = c.crash_window;
  o.initial_backoff = c.crash_initial_backoff;
  o.max_backoff = c.crash_max_backoff;
  o.quiet_period = c.crash_quiet_period;
  return o;
}

// Logs which memory backend this controller runs on and why. A configured "cuda" that cannot
// be used stops the start-up; "auto" falls back to the host backend with the reason.
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
      supervisor_(config_.engine_command, config_.socket_path(), config_.model_dir,
                  config_.runtime_dir, config_.engine_log_dir),
      pair_(NewPairMachine("pair", clock)),
      guard_(clock, GuardOptions(config_)),
      timelines_(clock),
      tick_(io),
      accept_retry_(io) {}

Controller::~Controller() {
  for (auto& [id, e] : engines_) e->process.KillAndReap();
}

Result<std::unique_ptr<Controller>> Controller::Create(boost::asio::io_context& io,
                                                       ControllerConfig config, Clock& clock) {
  std::unique_ptr<Controller> c(new Controller(io, std::move(config), clock));
  BATON_RETURN_IF_ERROR(c->Init());
  return c;
}

Status Controller::Init() {
  BATON_RETURN_IF_ERROR(MakeDir(config_.runtime_dir));
  BATON_RETURN_IF_ERROR(MakeDir(config_.state_dir));
  if (!config_.engine_log_dir.empty()) BATON_RETURN_IF_ERROR(MakeDir(config_.engine_log_dir));
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
  BATON_ASSIGN_OR_RETURN(EpochJournal journal,
                         EpochJournal::Open(config_.journal_path(), config_.epoch_reserve));
  journal_.emplace(std::move(journal));
  LoadCommands();
  BATON_LOG(INFO, kLog) << "epoch journal " << journal_->path() << " at epoch "
                        << journal_->current();
  ReplenishEpochs();

  WeightCacheOptions wopts;
  wopts.arena.numa_node = config_.numa_node;
  wopts.arena.huge_pages = config_.weights_huge_pages;
  wopts.arena.lock = config_.weights_lock;
  BATON_ASSIGN_OR_RETURN(WeightCache cache, WeightCache::Load(config_.model_dir, wopts));
  weights_.emplace(std::move(cache));
  for (const std::string& w : weights_->arena().warnings()) {
    BATON_LOG(WARN, kLog) << "weight arena: " << w;
  }

  const bool huge_blocks = config_.block_bytes % kHugePageSize == 0;
  if (config_.pool_huge_pages && !huge_blocks) {
    BATON_LOG(WARN, kLog) << "pool: block_bytes " << config_.block_bytes
                          << " is not a multiple of 2 MiB; using normal pages";
  }
  SharedMemoryOptions popts{.name = "baton-pool",
                            .size = uint64_t{config_.block_count} * config_.block_bytes,
                            .try_huge_pages = config_.pool_huge_pages && huge_blocks};
  BATON_ASSIGN_OR_RETURN(pool_, SharedMemory::Create(popts));
  if (!pool_.fallback_reason().empty()) {
    BATON_LOG(WARN, kLog) << "pool: huge pages unavailable, using normal pages: "
                          << pool_.fallback_reason();
  }
  BATON_ASSIGN_OR_RETURN(pool_map_, pool_.Map(Protection::kReadWrite, /*populate=*/true));
  if (Status sealed = pool_.Seal(Sealing::kFixedSize); !sealed.ok()) {
    BATON_LOG(WARN, kLog) << "pool: not sealed against resizing (" << sealed.message()
                          << "): an engine's ftruncate could take its pages from the others";
  }
  BATON_RETURN_IF_ERROR(SetUpDeviceMemory(backend, *ParseBackendMode(config_.gpu_backend)));
  ledger_ = std::make_unique<PoolLedger>(config_.block_count, *journal_);
  if (device_ != nullptr) {  // engines map the device pool by whole chunks
    BATON_RETURN_IF_ERROR(ledger_->SetBlocksPerChunk(
        static_cast<uint32_t>(device_->stats().pool_chunk_bytes / config_.block_bytes)));
  }
  BATON_LOG(INFO, kLog) << "pool: " << config_.block_count << " blocks of " << config_.block_bytes
                        << " bytes, huge_pages=" << pool_.huge_pages();

  // Sends never block the io thread: a peer that stops reading falls behind in its own queue
  // and is dropped once it takes nothing for a second or is a frame limit behind. Clients
  // (batonctl, routers) also share one budget, so many of them cannot make the controller
  // hold a frame limit each; engines are taken off it once they are known (AttachEngine).
  client_send_budget_ = std::make_shared<proto::SendBudget>(kClientSendBudget);
  proto::ChannelOptions copts{.max_send_frame_size = proto::kControllerMaxFrameSize,
                              .send_timeout = std::chrono::seconds(1),
                              .max_queued_send_bytes = proto::kControllerMaxFrameSize,
                              .send_budget = client_send_budget_,
                              .label = "unidentified peer",
                              .clock = &clock_};
  BATON_ASSIGN_OR_RETURN(proto::Listener listener,
                         proto::Listener::Bind(io_, config_.socket_path(), copts));
  listener_.emplace(std::move(listener));
  return OkStatus();
}

void Controller::Start() {
  BATON_LOG(INFO, kLog) << "listening on " << config_.socket_path()
                        << "; engine command: " << config_.engine_command.front();
  Accept();
  PublishRoutes();
  MaybeLaunch();
  ArmTick();
}

void Controller::Shutdown(std::function<void()> done) {
  if (stopping_) return;
  stopping_ = true;
  stop_done_ = std::move(done);
  BATON_LOG(INFO, kLog) << "shutting down: stopping " << engines_.size() << " engines (grace "
                        << Ms(config_.stop_grace) << " ms)";
  tick_.cancel();
  accept_retry_.cancel();
  if (listener_.has_value()) listener_->Close();
  for (auto& [id, e] : engines_) StopEngine(*e);
  stop_timer_ = std::make_shared<boost::asio::steady_timer>(io_);
  stop_timer_->expires_after(engines_.empty() ? Duration::zero() : config_.stop_grace);
  // Runs at the end of the grace, or at once when the last engine has been reaped (cancel).
  stop_timer_->async_wait([this](const boost::system::error_code&) { FinishShutdown(); });
}

void Controller::StopEngine(EngineRecord& e) {
  if (e.failed.has_value()) return;  // already killed: its reap is on the way
  Status sent = Unavailable("not connected");
  if (e.channel != nullptr)
    sent = e.channel->Send(proto::Stop{.reason = "the controller is shutting down"});
  // An engine that cannot be told (not connected yet, or its connection broke) gets SIGTERM.
  if (!sent.ok()) (void)e.process.Signal(SIGTERM);
}

void Controller::OnStoppedExit(EngineRecord& e, const ExitInfo& exit, bool killed) {
  if (killed) {
    BATON_LOG(WARN, kLog) << "engine " << e.id << " (pid " << e.process.pid() << ") still running "
                          << Ms(config_.stop_grace) << " ms after Stop: SIGKILL sent; "
                          << exit.ToString();
  } else {
    BATON_LOG(INFO, kLog) << "engine " << e.id << " (pid " << e.process.pid() << ") "
                          << (e.failed.has_value() ? "reaped" : "exited after Stop") << ": "
                          << exit.ToString();
  }
  exits_.push_back(EngineExit{clock_.Now(), e.id, e.process.pid(), e.launch_role,
                              e.failed.has_value() ? ToString(*e.failed) : "stopped",
                              exit.ToString()});
  if (exits_.size() > 20) exits_.pop_front();
  const EngineId id = e.id;
  engines_.erase(id);
  if (engines_.empty() && stop_timer_ != nullptr) stop_timer_->cancel();
}

void Controller::FinishShutdown() {
  if (!stop_done_) return;
  while (!engines_.empty()) {
    EngineRecord& e = *engines_.begin()->second;
    Result<std::optional<ExitInfo>> exited = e.process.TryReap();
    if (exited.ok() && exited->has_value()) {  // exited just before its pidfd wakeup ran
      OnStoppedExit(e, **exited, /*killed=*/false);
      continue;
    }
    e.process.KillAndReap();
    OnStoppedExit(e, *e.process.exit_info(), /*killed=*/true);
  }
  conns_.clear();
  listener_.reset();
  BATON_LOG(INFO, kLog) << "engines stopped at epoch " << journal_->current();
  std::function<void()> done = std::move(stop_done_);
  stop_done_ = nullptr;
  done();
}

bool Controller::backoff() const {
  return pair_.state() == PairState::kDegradedBackoff || pair_.state() == PairState::kDownBackoff;
}

// --- connections ------------------------------------------------------------------------------

void Controller::Accept() {
  listener_->AsyncAccept([this](Result<proto::Channel> channel) {
    if (stopping_) return;
    if (channel.ok()) {
      OnAccepted(std::move(channel).value());
    } else {
      // Out of fds, the connection stays queued and the next accept fails at once: wait.
      BATON_LOG(WARN, kLog) << "accept failed: " << channel.status().ToString()
                            << "; retrying in 100 ms";
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](boost::system::error_code ec) {
        if (!ec && !stopping_ && listener_.has_value() && listener_->is_open()) Accept();
      });
      return;
    }
    if (listener_.has_value() && listener_->is_open()) Accept();
  });
}

void Controller::OnAccepted(proto::Channel channel) {
  const uint64_t id = next_conn_++;
  Connection& c = conns_[id];
  c.channel = std::make_unique<proto::Channel>(std::move(channel));
  c.accepted_at = clock_.Now();
  c.channel->AsyncReceive(
      [this, id](Result<proto::ReceivedMessage> msg) { OnFirstMessage(id, std::move(msg)); });
}

void Controller::OnFirstMessage(uint64_t conn, Result<proto::ReceivedMessage> msg) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  std::unique_ptr<proto::Channel> channel = std::move(it->second.channel);
  conns_.erase(it);
  if (!msg.ok()) return;  // the channel logged why it closed
  proto::ServerHelloOptions options{.server_name = config_.name,
                                    .admit = [this](const proto::Hello& h) { return Admit(h); }};
  Result<proto::AcceptedHello> accepted = proto::AnswerHello(*channel, *msg, options);
  if (!accepted.ok()) {
    Refused(channel->label(), accepted.status().message());
    return;
  }
  const proto::Hello& hello = accepted->hello;
  channel->set_label(hello.peer_name.empty() ? hello.role : hello.peer_name);
  if (hello.role == "engine") {
    AttachEngine(FindByToken(hello.launch_token)->id, std::move(channel));
  } else if (hello.role == "router") {
    routes_.AddSubscriber(std::move(channel), hello.peer_name);
  } else {
    Connection& c = conns_[conn];
    c.channel = std::move(channel);
    c.accepted_at = clock_.Now();
    c.cli = true;
    ReadCli(conn);
  }
  ArmTick();
}

Status Controller::Admit(const proto::Hello& hello) {
  if (stopping_) return Unavailable("the controller is shutting down");
  if (hello.role == "cli" || hello.role == "router") return OkStatus();
  if (hello.role != "engine") {
    return FailedPrecondition("unknown role '" + hello.role + "' (engine, cli or router)");
  }
  EngineRecord* e = FindByToken(hello.launch_token);
  if (e == nullptr) {
    return FailedPrecondition("wrong launch token: engines must be launched by this controller");
  }
  if (e->failed.has_value()) {
    return FailedPrecondition("engine " + std::to_string(e->id) + " is being fenced");
  }
  if (e->channel != nullptr || e->registered) {
    return FailedPrecondition("engine " + std::to_string(e->id) + " is already connected");
  }
  return OkStatus();
}

void Controller::ReadCli(uint64_t conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  it->second.channel->AsyncReceive([this, conn](Result<proto::ReceivedMessage> msg) {
    auto it = conns_.find(conn);
    if (it == conns_.end()) return;
    if (!msg.ok()) {
      conns_.erase(it);
      return;
    }
    proto::CtlReply reply{.exit_code = 2, .text = "", .json = ""};
    Result<proto::CtlRequest> request = msg->As<proto::CtlRequest>();
    if (request.ok()) {
      reply = HandleCtlRequest(*this, *request);
    } else {
      reply.text = "refused: " + request.status().message();
      Refused(it->second.channel->label(), request.status().message());
    }
    it = conns_.find(conn);
    if (it == conns_.end()) return;
    Status sent = it->second.channel->Send(reply);
    if (!sent.ok()) {
      BATON_LOG(WARN, kLog) << "dropping client " << it->second.channel->label() << ": "
                            << sent.message();
      conns_.erase(it);
      return;
    }
    ReadCli(conn);
    ArmTick();
  });
}

void Controller::Refused(const std::string& who, const std::string& reason) {
  BATON_LOG(WARN, kLog) << "refused " << who << ": " << reason;
  refusals_.push_back(Refusal{clock_.Now(), who, reason});
  if (refusals_.size() > kKeepRefusals) refusals_.pop_front();
  ++refusal_count_;
}

void Controller::CloseIdleConnections() {
  const TimePoint now = clock_.Now();
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (!it->second.cli && now - it->second.accepted_at > kHelloTimeout) {
      Refused(it->second.channel->label(), "no Hello within 5 s");
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

// --- timer --------------------------------------------------------------------------------------

void Controller::ArmTick() {
  if (stopping_) return;
  const TimePoint now = clock_.Now();
  TimePoint when = now + kMaxTickInterval;
  for (const auto& [id, e] : engines_) {
    if (e->detector.has_value()) when = std::min(when, e->detector->NextDeadline());
    if (e->deadline.has_value()) when = std::min(when, *e->deadline);
  }
  if (const std::optional<TimePoint> launch = NextLaunchAt(); launch.has_value()) {
    when = std::min(when, *launch);
  }
  if (!barrier_waits_.empty()) when = std::min(when, now + kGpuReleasePoll);
  if (cuda_backend_ && config_.gpu_probe_interval > Duration::zero()) {
    when = std::min(when, std::max(now, next_device_probe_));
  }
  if (tick_at_.has_value() && *tick_at_ <= when && *tick_at_ > now) return;
  tick_at_ = when;
  tick_.expires_after(std::max(Duration::zero(), when - now));
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    tick_at_.reset();
    OnTick();
  });
}

// Keeps a batch of epochs durable ahead of the next promotion, at a moment when no failover
// is in flight; a journal that cannot be written is logged once until it can again.
void Controller::ReplenishEpochs() {
  if (failover_.has_value() || promoting_ != kNoEngine || !barrier_waits_.empty()) return;
  if (clock_.Now() < next_replenish_) return;
  const uint64_t before = journal_->reserved();
  Status s = journal_->Replenish();
  NoteJournalState();
  if (!s.ok()) {
    next_replenish_ = clock_.Now() + std::chrono::seconds(5);  // each try spends a batch
    if (!replenish_failing_) {
      BATON_LOG(ERROR, kLog) << "cannot reserve epochs ahead (promotions will write the journal "
                                "themselves): "
                             << s.ToString();
    }
    replenish_failing_ = true;
    return;
  }
  replenish_failing_ = false;
  if (journal_->reserved() != before) {
    BATON_LOG(INFO, kLog) << "epochs reserved through " << journal_->reserved();
  }
}

void Controller::OnTick() {
  ++ticks_;
  TickUpgrade();
  GiveFreeBlocksToPrimary();
  RetireStaleStandbys();
  CheckDevice();
  ReplenishEpochs();
  RetryUnfencedHolders();
  PollBarrierWaits();
  PollEngines();
  MaybePromote();
  MaybeLaunch();
  CloseIdleConnections();
  ArmTick();
}

}  // namespace baton
