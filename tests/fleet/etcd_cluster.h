// EtcdCluster: a real etcd cluster for tests (Debian's etcd-server), its members on loopback
// addresses of their own (127.A.B.11, .12, ...: A.B from the process and a count, so that two
// clusters of tests run at once share no address), each with a data directory under a
// temporary directory that the cluster removes. Members can be killed, frozen (SIGSTOP), thawed and
// started again on their data; the destructor kills every member.
//
// With `tls` the members serve their client port over TLS only (https://), with a server
// certificate of a test CA (tests/fleet/test_certificates.h) and --client-cert-auth: a client
// must present a certificate of that CA (client_tls()). Peers speak plain HTTP among
// themselves.
//
// Header-only test support; one thread.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/process/run_guard.h"
#include "fleet/etcd_client.h"
#include "tests/fleet/test_certificates.h"
#include "tests/support/free_port.h"

extern char** environ;

namespace baton::fleet_test {

inline constexpr const char* kEtcdBinary = "/usr/bin/etcd";

// A TCP port free on `ip` now, below the ephemeral range (tests/support/free_port.h): a
// member's port must stay free until the member binds it, which a port the kernel picked and
// released does not.
inline int FreePort(const std::string& ip) { return testing_support::FreePort(ip); }

// "127.A.B.": a loopback /24 no other EtcdCluster of any test process uses now (the pid's
// low bits and a count in this process), never 127.0.x.x (engines and routers bind there).
inline std::string ClusterSubnet() {
  static int clusters = 0;
  const int n = (static_cast<int>(::getpid()) % 4096) * 16 + (clusters++ % 16);
  return "127." + std::to_string(1 + n / 256 % 254) + "." + std::to_string(n % 256) + ".";
}

class EtcdCluster {
 public:
  struct Member {
    std::string name, ip, data_dir, log;
    std::string scheme = "http";  // of the client port
    int client_port = 0, peer_port = 0;
    pid_t pid = 0;
    std::string client_url() const {
      return scheme + "://" + ip + ":" + std::to_string(client_port);
    }
    std::string peer_url() const { return "http://" + ip + ":" + std::to_string(peer_port); }
  };

  // `server_sans`: the server certificate's subjectAltName with `tls`; empty: every member's
  // IP address.
  explicit EtcdCluster(int members, bool tls = false, std::string server_sans = "") {
    char tmpl[] = "/tmp/baton-etcd-XXXXXX";
    dir_ = ::mkdtemp(tmpl) != nullptr ? tmpl : "";
    RunGuard::RemoveIfInterrupted(dir_);  // its members' data: hundreds of MB
    const std::string subnet = ClusterSubnet();
    if (tls) {
      if (server_sans.empty()) {
        for (int i = 0; i < members; ++i) {
          server_sans += (i == 0 ? "IP:" : ",IP:") + subnet + std::to_string(11 + i);
        }
      }
      std::filesystem::create_directories(dir_ + "/pki");
      certs_ = TestCertificates::Make(dir_ + "/pki", server_sans);
    }
    for (int i = 0; i < members; ++i) {
      Member m;
      m.name = "m" + std::to_string(i);
      m.scheme = tls ? "https" : "http";
      m.ip = subnet + std::to_string(11 + i);
      m.data_dir = dir_ + "/" + m.name;
      m.log = dir_ + "/" + m.name + ".log";
      m.client_port = testing_support::FreePorts(2, m.ip);
      m.peer_port = m.client_port + 1;
      members_.push_back(m);
    }
    for (int i = 0; i < members; ++i) Start(i, /*existing=*/false);
  }
  ~EtcdCluster() {
    for (int i = 0; i < size(); ++i) Kill(i);
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  static bool Installed() { return ::access(kEtcdBinary, X_OK) == 0; }

  // With `tls`: the certificates were made (nullopt otherwise; see <dir>/pki/openssl.log).
  const std::optional<TestCertificates>& certs() const { return certs_; }
  // What a client needs to be let in: the CA and the client certificate; empty without `tls`.
  TlsClientOptions client_tls() const {
    if (!certs_) return {};
    return {
        .ca_file = certs_->ca, .cert_file = certs_->client_cert, .key_file = certs_->client_key};
  }

  int size() const { return static_cast<int>(members_.size()); }
  const Member& member(int i) const { return members_[i]; }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (const Member& m : members_) out.push_back(m.client_url());
    return out;
  }
  std::string dir() const { return dir_; }

  // The last lines of every member's log, for a failure's message.
  std::string LogTails(size_t bytes = 1500) const {
    std::string out;
    for (const Member& m : members_) {
      std::ifstream in(m.log);
      const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      out += "--- " + m.name + " (" + m.client_url() + ", pid " + std::to_string(m.pid) + "):\n" +
             log.substr(log.size() > bytes ? log.size() - bytes : 0) + "\n";
    }
    return out;
  }

  // Waits until every running member answers a read (a quorum formed); false after `wait`.
  bool WaitHealthy(std::chrono::seconds wait = std::chrono::seconds(30)) const {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (int i = 0; i < size(); ++i) {
      if (members_[i].pid == 0) continue;
      auto c = EtcdClient::Create({.endpoints = {members_[i].client_url()},
                                   .timeout = std::chrono::milliseconds(500),
                                   .tls = client_tls()});
      while (!c.ok() || !(*c)->Get("health").ok()) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    return true;
  }

  // Starts member i: a new cluster's first start, or again on its data (`existing`).
  void Start(int i, bool existing = true) {
    Member& m = members_[i];
    if (m.pid != 0) return;
    std::string initial;
    for (const Member& o : members_) {
      initial += (initial.empty() ? "" : ",") + o.name + "=" + o.peer_url();
    }
    std::vector<std::string> argv = {kEtcdBinary,
                                     "--name",
                                     m.name,
                                     "--data-dir",
                                     m.data_dir,
                                     "--listen-client-urls",
                                     m.client_url(),
                                     "--advertise-client-urls",
                                     m.client_url(),
                                     "--listen-peer-urls",
                                     m.peer_url(),
                                     "--initial-advertise-peer-urls",
                                     m.peer_url(),
                                     "--initial-cluster",
                                     initial,
                                     "--initial-cluster-state",
                                     existing ? "existing" : "new",
                                     "--initial-cluster-token",
                                     "baton-" + dir_,
                                     "--heartbeat-interval",
                                     "50",
                                     "--election-timeout",
                                     "500"};
    if (certs_) {
      for (const std::string& a :
           {std::string("--cert-file"), certs_->server_cert, std::string("--key-file"),
            certs_->server_key, std::string("--trusted-ca-file"), certs_->ca,
            std::string("--client-cert-auth")}) {
        argv.push_back(a);
      }
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, m.log.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    if (::posix_spawn(&m.pid, args[0], &actions, nullptr, args.data(), environ) != 0) m.pid = 0;
    posix_spawn_file_actions_destroy(&actions);
  }
  // kill -9 and reap.
  void Kill(int i) {
    Member& m = members_[i];
    if (m.pid == 0) return;
    ::kill(m.pid, SIGCONT);
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = 0;
  }
  // SIGSTOP and SIGCONT to member i; nothing when it is not running (pid 0 would be this
  // process's own group).
  void Freeze(int i) {
    if (members_[i].pid > 0) ::kill(members_[i].pid, SIGSTOP);
  }
  void Thaw(int i) {
    if (members_[i].pid > 0) ::kill(members_[i].pid, SIGCONT);
  }

 private:
  std::string dir_;
  std::optional<TestCertificates> certs_;
  std::vector<Member> members_;
};

}  // namespace baton::fleet_test
