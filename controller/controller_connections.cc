// Controller: its connections. controller.sock (and [controller] router_socket, for routers
// only) accepted, each connection's Hello admitted by role and by the process behind it,
// batonctl's requests answered, idle and silent connections closed.
#include <sys/stat.h>

#include <boost/asio/post.hpp>
#include <filesystem>

#include "base/log.h"
#include "controller/controller.h"
#include "controller/ctl/ctl_service.h"
#include "proto/hello.h"

namespace baton {
namespace {

constexpr const char* kLog = "controller";
constexpr Duration kHelloTimeout = std::chrono::seconds(5);
// A client (batonctl) connection with no request for this long is closed, and at most
// kMaxClients are open at once: idle clients cannot take the fds engines need.
constexpr Duration kClientIdleTimeout = std::chrono::seconds(60);
constexpr size_t kMaxClients = 256;
// Routers subscribed at once, and connections on the router socket that have not said Hello
// yet: a user of the routers' group cannot take the fds engines need.
constexpr size_t kMaxRouters = 256;
constexpr size_t kMaxRouterSocketWaiting = 64;

}  // namespace

Status Controller::BindRouterSocket(const proto::ChannelOptions& options) {
  if (config_.router_socket.empty()) return OkStatus();
  const std::string dir = std::filesystem::path(config_.router_socket).parent_path().string();
  if (struct stat d{}; ::stat(dir.c_str(), &d) != 0 || !S_ISDIR(d.st_mode)) {
    return FailedPrecondition("controller.router_socket: its directory " + dir +
                              " is missing; it is the routers' to reach (deploy/tmpfiles/"
                              "baton.conf makes /run/baton-routes: systemd-tmpfiles --create)");
  }
  BATON_ASSIGN_OR_RETURN(proto::Listener listener,
                         proto::Listener::Bind(io_, config_.router_socket, options, 0660));
  struct stat st {};
  if (::stat(config_.router_socket.c_str(), &st) != 0) {
    return ErrnoStatus("stat " + config_.router_socket, errno);
  }
  BATON_LOG(INFO, kLog) << "routers only on " << config_.router_socket << " (mode 0660, uid "
                        << st.st_uid << ", gid " << st.st_gid << ")";
  router_listener_.emplace(std::move(listener));
  return OkStatus();
}

void Controller::Accept(bool routers_only) {
  std::optional<proto::Listener>& listener = routers_only ? router_listener_ : listener_;
  listener->AsyncAccept([this, routers_only, &listener](Result<proto::Channel> channel) {
    if (stopping_) return;
    if (channel.ok()) {
      OnAccepted(std::move(channel).value(), routers_only);
    } else {
      // Out of fds, the connection stays queued and the next accept fails at once: wait.
      BATON_LOG(WARN, kLog) << "accept failed on " << listener->path() << ": "
                            << channel.status().ToString() << "; retrying in 100 ms";
      boost::asio::steady_timer& retry = routers_only ? router_accept_retry_ : accept_retry_;
      retry.expires_after(std::chrono::milliseconds(100));
      retry.async_wait([this, routers_only, &listener](boost::system::error_code ec) {
        if (!ec && !stopping_ && listener.has_value() && listener->is_open()) {
          Accept(routers_only);
        }
      });
      return;
    }
    if (listener.has_value() && listener->is_open()) Accept(routers_only);
  });
}

void Controller::OnAccepted(proto::Channel channel, bool routers_only) {
  if (routers_only) {
    size_t waiting = 0;
    for (const auto& [id, c] : conns_) waiting += c.routers_only ? 1 : 0;
    if (waiting >= kMaxRouterSocketWaiting) {
      coord_->NoteRefusal(channel.label(), std::to_string(kMaxRouterSocketWaiting) +
                                               " connections on the router socket wait for "
                                               "their Hello: closed");
      return;
    }
  }
  const uint64_t id = next_conn_++;
  Connection& c = conns_[id];
  c.channel = std::make_unique<proto::Channel>(std::move(channel));
  c.accepted_at = clock_.Now();
  c.routers_only = routers_only;
  c.channel->AsyncReceive(
      [this, id](Result<proto::ReceivedMessage> msg) { OnFirstMessage(id, std::move(msg)); });
}

void Controller::OnFirstMessage(uint64_t conn, Result<proto::ReceivedMessage> msg) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  std::unique_ptr<proto::Channel> channel = std::move(it->second.channel);
  const bool routers_only = it->second.routers_only;
  conns_.erase(it);
  if (!msg.ok()) return;  // the channel logged why it closed
  Result<proto::PeerCredentials> creds = channel->peer_credentials();
  Result<UniqueFd> pidfd = channel->peer_pidfd();
  const Peer peer{.pid = creds.ok() ? creds->pid : 0,
                  .pidfd = pidfd.ok() ? pidfd->get() : -1,
                  .routers_only = routers_only};
  proto::ServerHelloOptions options{
      .server_name = config_.name,
      .admit = [this, &peer](const proto::Hello& h) { return Admit(h, peer); }};
  Result<proto::AcceptedHello> accepted = proto::AnswerHello(*channel, *msg, options);
  if (!accepted.ok()) {
    coord_->NoteRefusal(channel->label(), accepted.status().message());
    return;
  }
  const proto::Hello& hello = accepted->hello;
  channel->set_label(hello.peer_name.empty() ? ToString(hello.role) : hello.peer_name);
  if (hello.role == proto::PeerRole::kEngine) {
    AttachEngine(*coord_->Admit(hello.launch_token), std::move(channel));
  } else if (hello.role == proto::PeerRole::kRouter) {
    routes_.AddSubscriber(std::move(channel), hello.peer_name);
  } else if (Clients() >= kMaxClients) {
    BATON_LOG(WARN, kLog) << "client " << channel->label() << " closed: " << kMaxClients
                          << " client connections are open";
    (void)channel->Send(proto::CtlReply{
        .exit_code = 1,
        .text = "refused: " + std::to_string(kMaxClients) + " client connections are open",
        .json = ""});
  } else {
    Connection& c = conns_[conn];
    c.channel = std::move(channel);
    c.accepted_at = clock_.Now();
    c.cli = true;
    ReadCli(conn);
  }
  ArmTick();
}

Status Controller::Admit(const proto::Hello& hello, const Peer& peer) {
  if (stopping_) return Unavailable("the controller is shutting down");
  if (peer.routers_only && hello.role != proto::PeerRole::kRouter) {
    return FailedPrecondition(config_.router_socket + " serves routers only, not role '" +
                              ToString(hello.role) + "': connect to " + config_.socket_path());
  }
  switch (hello.role) {
    case proto::PeerRole::kRouter:
      if (routes_.subscriber_count() >= kMaxRouters) {
        return ResourceExhausted(std::to_string(kMaxRouters) + " routers are subscribed");
      }
      return CheckPeerOrigin(hello, 0, peer);
    case proto::PeerRole::kCli:
      return CheckPeerOrigin(hello, 0, peer);
    case proto::PeerRole::kEngine: {
      BATON_ASSIGN_OR_RETURN(EngineId id, coord_->Admit(hello.launch_token));
      return CheckPeerOrigin(hello, id, peer);
    }
    case proto::PeerRole::kController:
    case proto::PeerRole::kDrill:
      break;
  }
  return FailedPrecondition(std::string("the controller does not serve role '") +
                            ToString(hello.role) + "' (engine, cli or router)");
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
    it->second.busy = true;
    proto::CtlReply reply{.exit_code = 2, .text = "", .json = ""};
    Result<proto::CtlRequest> request = msg->As<proto::CtlRequest>();
    if (request.ok() && request->command == "fleet" && rollout_ != nullptr) {
      // etcd calls block: the rollout's thread answers, the reply comes back here.
      rollout_->Submit(std::move(request).value(), [this, conn](proto::CtlReply r) {
        boost::asio::post(io_, [this, conn, r = std::move(r)] { AnswerCli(conn, r); });
      });
      return;
    }
    if (request.ok()) {
      reply = HandleCtlRequest(*this, *request);
    } else {
      reply.text = "refused: " + request.status().message();
      coord_->NoteRefusal(it->second.channel->label(), request.status().message());
    }
    AnswerCli(conn, reply);
  });
}

void Controller::AnswerCli(uint64_t conn, const proto::CtlReply& reply) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  Status sent = it->second.channel->Send(reply);
  if (!sent.ok()) {
    BATON_LOG(WARN, kLog) << "dropping client " << it->second.channel->label() << ": "
                          << sent.message();
    conns_.erase(it);
    return;
  }
  it->second.busy = false;
  it->second.accepted_at = clock_.Now();  // idle from its last answer
  ReadCli(conn);
  ArmTick();
}

size_t Controller::Clients() const {
  size_t n = 0;
  for (const auto& [id, c] : conns_) n += c.cli ? 1 : 0;
  return n;
}

void Controller::CloseIdleConnections() {
  const TimePoint now = clock_.Now();
  for (auto it = conns_.begin(); it != conns_.end();) {
    const Connection& c = it->second;
    if (!c.cli && now - c.accepted_at > kHelloTimeout) {
      coord_->NoteRefusal(c.channel->label(), "no Hello within 5 s");
      it = conns_.erase(it);
    } else if (c.cli && !c.busy && now - c.accepted_at > kClientIdleTimeout) {
      BATON_LOG(INFO, kLog)
          << "client " << c.channel->label() << " closed: no request in "
          << std::chrono::duration_cast<std::chrono::seconds>(kClientIdleTimeout).count() << " s";
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace baton
