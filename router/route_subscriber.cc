#include "router/route_subscriber.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cstdio>

#include "base/io/private_dir.h"
#include "base/io/small_file.h"
#include "base/log.h"
#include "proto/hello.h"
#include "proto/transport/channel.h"
#include "proto/transport/listener.h"
#include "proto/wire/frame.h"

namespace baton {
namespace {

// 16 random hex digits (getrandom; the pid and the time where it fails).
std::string NewInstanceName() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    v = static_cast<uint64_t>(::getpid()) << 32 ^
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// As long as the Hello that follows may take (proto/hello.h).
constexpr std::chrono::seconds kConnectTimeout(5);

// The controller's socket, once its directory passes a client's check (base/io/private_dir.h):
// a socket in a directory another user made may be theirs, with forged route tables.
Result<proto::Channel> ConnectToController(boost::asio::io_context& io, const std::string& socket) {
  const Status dir = CheckPrivateDir(ParentDir(socket), DirOwner::kSelfOrRoot,
                                     "controller socket's directory", "the router's --controller");
  if (!dir.ok() && dir.code() != StatusCode::kNotFound) return dir;
  // Bounded: a frozen controller with a full backlog would hold connect(2), and Stop() with it.
  return proto::Connect(io, socket, {}, kConnectTimeout);
}

}  // namespace

RouteSubscriber::RouteSubscriber() : instance_(NewInstanceName()) {}

void RouteSubscriber::SetStatic(const std::string& address) {
  proto::RouteTable table;
  table.version = 1;
  table.pair_state = "static";
  table.entries.push_back(proto::RouteEntry{.engine_id = 0,
                                            .role = proto::EngineRole::kPrimary,
                                            .http_address = address,
                                            .ready = true,
                                            .weight = 100,
                                            .engine_version = ""});
  Store(std::move(table));
}

void RouteSubscriber::Start(std::string socket_path, std::chrono::milliseconds max_backoff) {
  socket_path_ = std::move(socket_path);
  max_backoff_ = max_backoff;
  thread_ = std::thread([this] { Run(); });
}

void RouteSubscriber::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

std::optional<std::string> RouteSubscriber::Primary() const {
  MutexLock lock(mu_);
  for (const proto::RouteEntry& e : table_.entries) {
    if (e.role == proto::EngineRole::kPrimary && e.ready && !e.http_address.empty())
      return e.http_address;
  }
  return std::nullopt;
}

proto::RouteTable RouteSubscriber::table() const {
  MutexLock lock(mu_);
  return table_;
}

void RouteSubscriber::Store(proto::RouteTable table) {
  {
    MutexLock lock(mu_);
    table_ = table;
  }
  if (on_change_) on_change_(table);
}

bool RouteSubscriber::Wait(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (!stopping_) {
    if (cv_.WaitUntil(mu_, deadline) == std::cv_status::timeout) break;
  }
  return !stopping_;
}

void RouteSubscriber::Run() {
  std::chrono::milliseconds backoff(50);
  while (Wait(std::chrono::milliseconds(0))) {
    const bool was_connected = connected_.load();
    Subscribe();
    if (connected_.exchange(false) || was_connected) backoff = std::chrono::milliseconds(50);
    if (!Wait(backoff)) return;
    backoff = std::min(backoff * 2, max_backoff_);
  }
}

// One subscription: connect, Hello, Subscribe, then tables until the channel fails.
void RouteSubscriber::Subscribe() {
  boost::asio::io_context io;
  Result<proto::Channel> channel = ConnectToController(io, socket_path_);
  if (!channel.ok()) {
    // Once until it is reached (a wrong socket path, a controller not started or restarting);
    // each later try at DEBUG.
    if (!unreachable_logged_) {
      BATON_LOG(WARN, "router") << "controller unreachable at " << socket_path_ << ": "
                                << channel.status().ToString() << "; trying again until it answers";
    } else {
      BATON_LOG(DEBUG, "router") << "controller unreachable at " << socket_path_ << ": "
                                 << channel.status().ToString();
    }
    unreachable_logged_ = true;
    return;
  }
  Result<proto::HelloAck> ack = proto::ClientHello(
      *channel,
      {.peer_name = "baton-router", .role = proto::PeerRole::kRouter, .launch_token = ""});
  if (!ack.ok()) {
    BATON_LOG(WARN, "router") << "controller refused the router: " << ack.status().ToString();
    return;
  }
  if (Status st = channel->Send(proto::Subscribe{.subscriber = "baton-router"}); !st.ok()) {
    BATON_LOG(WARN, "router") << "subscribe failed: " << st.ToString();
    return;
  }
  connected_ = true;
  oversize_logged_ = false;
  unreachable_logged_ = false;
  if (Result<proto::PeerCredentials> peer = channel->peer_credentials(); peer.ok()) {
    if (controller_pid_ != 0 && peer->pid != controller_pid_) {
      BATON_LOG(INFO, "router") << "a new controller (pid " << peer->pid << ", was "
                                << controller_pid_
                                << "): its first route table says whether the primary was "
                                   "re-adopted or is a new engine";
      if (on_new_controller_) on_new_controller_();
    }
    controller_pid_ = peer->pid;
  }
  const bool reports = on_report_ && ack->version >= proto::kProtocolVersionRouterReport;
  const bool stalls = on_stall_ && ack->version >= proto::kProtocolVersionEngineStalled;
  BATON_LOG(INFO, "router") << "subscribed to the route table at " << socket_path_ << " (protocol "
                            << ack->version << (reports ? ", reporting outcomes)" : ")");
  using SteadyClock = std::chrono::steady_clock;
  SteadyClock::time_point next_report = SteadyClock::now();
  while (Wait(std::chrono::milliseconds(0))) {
    std::chrono::milliseconds wait(200);
    if (reports) {
      const SteadyClock::time_point now = SteadyClock::now();
      if (now >= next_report) {
        next_report = now + kReportInterval;
        if (!SendReport(*channel, stalls)) return;
      }
      wait = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(next_report - now),
                        std::chrono::milliseconds(1), wait);
    }
    Result<proto::ReceivedMessage> msg = channel->Receive(wait);
    if (!msg.ok() && msg.status().code() == StatusCode::kDeadlineExceeded) continue;
    Result<proto::RouteTable> table =
        msg.ok() ? msg->As<proto::RouteTable>() : Result<proto::RouteTable>(msg.status());
    if (!table.ok()) {
      BATON_LOG(WARN, "router") << "controller connection lost, keeping the last route table: "
                                << table.status().ToString();
      return;
    }
    std::string primary = "none";
    for (const proto::RouteEntry& e : table->entries) {
      if (e.role == proto::EngineRole::kPrimary && e.ready) primary = e.http_address;
    }
    std::string line = "route table v" + std::to_string(table->version) + " epoch " +
                       std::to_string(table->epoch) + " state " + table->pair_state + " primary " +
                       primary;
    if (line != last_table_line_) BATON_LOG(INFO, "router") << line;
    last_table_line_ = std::move(line);
    Store(std::move(*table));
  }
}

bool RouteSubscriber::SendReport(proto::Channel& channel, bool stalls) {
  proto::RouterReport report{
      .seq = report_seq_.load() + 1, .engines = on_report_(), .router = instance_};
  Result<std::string> payload = proto::Encode(report);
  Status st = payload.status();
  if (st.ok() && payload->size() > proto::kDefaultMaxFrameSize) {
    if (!oversize_logged_) {
      BATON_LOG(ERROR, "router") << "a RouterReport of " << report.engines.size() << " engines is "
                                 << payload->size() << " bytes, past the frame limit of "
                                 << proto::kDefaultMaxFrameSize
                                 << ": not sent (canaries hold) until pruning makes it fit";
      oversize_logged_ = true;
    }
  } else if (st.ok()) {
    oversize_logged_ = false;
    st = channel.SendFrame(proto::RouterReport::kType, *payload);
    if (st.ok()) report_seq_ = report.seq;
  }
  for (proto::EngineStalled& stall : stalls ? on_stall_() : std::vector<proto::EngineStalled>{}) {
    if (!st.ok()) break;
    stall.router = instance_;
    st = channel.Send(stall);
  }
  if (st.ok()) return true;
  BATON_LOG(WARN, "router")
      << "controller connection lost sending a report, keeping the last route table: "
      << st.ToString();
  return false;
}

}  // namespace baton
