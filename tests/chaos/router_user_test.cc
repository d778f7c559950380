// A router that runs as another user than the controller's (docs/operations.md, Users and
// ports): it reaches the controller through [controller] router_socket, a socket of mode
// 0660 in a setgid directory of the routers' group, which serves routers only; controller.sock
// stays out of its reach. Run as root (the suite's machines are), since the router is started
// as uid 65534 through setpriv; skipped otherwise.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "proto/hello.h"
#include "proto/transport/listener.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/chaos/misbehavior_support.h"
#include "tests/chaos/router_stream_support.h"

namespace baton::chaos {
namespace {

constexpr uid_t kRouterUid = 65534;
constexpr gid_t kRoutersGid = 65534;  // the routers' group
constexpr gid_t kOtherGid = 65533;

// A directory of the routers' group, setgid (what deploy/tmpfiles/baton.conf makes), removed
// with this object.
class RoutesDir {
 public:
  RoutesDir() {
    char tmpl[] = "/tmp/baton-routes-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
    if (!path_.empty() &&
        (::chown(path_.c_str(), 0, kRoutersGid) != 0 || ::chmod(path_.c_str(), 02750) != 0)) {
      ADD_FAILURE() << "chown/chmod " << path_ << ": " << std::strerror(errno);
    }
  }
  ~RoutesDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// errno of connect() to `path` from a child process of uid kRouterUid and group `gid`; 0 when
// it connected.
int ConnectErrorAs(gid_t gid, const std::string& path) {
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(kRouterUid) != 0) {
      ::_exit(255);
    }
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::_exit(rc == 0 ? 0 : errno);
  }
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// Whether uid kRouterUid may run build/bin/baton-router (a build in a home directory of
// mode 0700 is out of its reach).
bool RouterUserCanRunTheRouter() {
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(kRoutersGid) != 0 || ::setuid(kRouterUid) != 0) {
      ::_exit(2);
    }
    ::_exit(::access(BATON_BIN_DIR "/baton-router", X_OK) == 0 ? 0 : 1);
  }
  int status = 0;
  return child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

TEST(ChaosRouterUser, ARouterOfAnotherUserServesThroughTheRouterSocketOnly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run the router as another user";
  if (!RouterUserCanRunTheRouter()) {
    GTEST_SKIP() << "uid " << kRouterUid << " cannot run " << BATON_BIN_DIR << "/baton-router";
  }
  RoutesDir routes;
  ASSERT_FALSE(routes.path().empty());
  ClusterOptions options = RefenginePair();
  options.router_socket = routes.path() + "/controller.sock";
  ChaosCluster cluster(options);

  struct stat st {};
  ASSERT_EQ(::stat(options.router_socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, kRoutersGid) << "the socket takes the setgid directory's group";
  EXPECT_EQ(cluster.Status()["controller"]["router_socket"], options.router_socket);

  // The router socket serves routers only, whoever asks.
  boost::asio::io_context io;
  for (proto::PeerRole role : {proto::PeerRole::kCli, proto::PeerRole::kEngine}) {
    Result<proto::Channel> raw = proto::Connect(io, options.router_socket);
    ASSERT_TRUE(raw.ok()) << raw.status().ToString();
    Result<proto::HelloAck> ack =
        proto::ClientHello(*raw, {.peer_name = "test", .role = role, .launch_token = ""});
    ASSERT_FALSE(ack.ok());
    EXPECT_NE(ack.status().message().find("serves routers only, not role '" +
                                          std::string(ToString(role)) + "'"),
              std::string::npos)
        << ack.status().ToString();
  }

  // The routers' user reaches the router socket, and neither controller.sock nor, outside
  // the routers' group, the router socket.
  EXPECT_EQ(ConnectErrorAs(kRoutersGid, options.router_socket), 0);
  EXPECT_EQ(ConnectErrorAs(kRoutersGid, cluster.socket()), EACCES);
  EXPECT_EQ(ConnectErrorAs(kOtherGid, options.router_socket), EACCES);

  const std::vector<std::string> as_router_user = {
      "/usr/bin/setpriv", "--reuid=" + std::to_string(kRouterUid),
      "--regid=" + std::to_string(kRoutersGid), "--clear-groups", "--"};
  RouterProcess router({"--controller", options.router_socket}, cluster.dir(), "router.log",
                       as_router_user);
  ASSERT_TRUE(router.ready()) << router.Log();
  const json request = {{"model", kRouterTestModel}, {"prompt", "hello"}, {"max_tokens", 4}};
  const Reply reply = Fetch(router.port(), http::verb::post, "/v1/completions", request.dump(),
                            std::chrono::seconds(10));
  EXPECT_EQ(reply.status, 200) << reply.body << reply.error << router.Log();
  EXPECT_NE(router.Log().find("subscribed to the route table at " + options.router_socket),
            std::string::npos)
      << router.Log();

  // Connections that never say Hello take at most 64 places on the router socket; the router
  // already subscribed serves on, and a router is served again once they are gone.
  std::vector<proto::Channel> silent;
  for (int i = 0; i < 70; ++i) {
    Result<proto::Channel> raw = proto::Connect(io, options.router_socket);
    ASSERT_TRUE(raw.ok()) << raw.status().ToString();
    silent.push_back(std::move(raw).value());
  }
  WaitRefusal(cluster, "64 connections on the router socket wait for their Hello");
  EXPECT_EQ(Fetch(router.port(), http::verb::post, "/v1/completions", request.dump(),
                  std::chrono::seconds(10))
                .status,
            200);
  silent.clear();  // the controller sees them close, then frees their places
  Status served = Unavailable("not tried");
  for (int i = 0; i < 500 && !served.ok(); ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    Result<proto::Channel> later = proto::Connect(io, options.router_socket);
    ASSERT_TRUE(later.ok()) << later.status().ToString();
    served =
        proto::ClientHello(
            *later, {.peer_name = "later", .role = proto::PeerRole::kRouter, .launch_token = ""})
            .status();
  }
  EXPECT_TRUE(served.ok()) << served.ToString();
}

}  // namespace
}  // namespace baton::chaos
