// Support for tests/chaos/router_stream_test.cc: baton-router as a child process subscribed
// to a ChaosCluster's controller, the reference engine as the cluster's engine command, child
// processes with piped stdio (the node client, curl), a blocking HTTP call, a paced pair whose
// streams last long enough to be cut, and parsers for completion bodies.
//
// Header-only test support (the test build compiles *_test.cc files only), like
// chaos_harness.h. Fetch() may be called from any thread; the rest from the test's main
// thread.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/io/unique_fd.h"
#include "tests/chaos/chaos_harness.h"
#include "tests/support/free_port.h"

namespace baton::chaos {

namespace http = boost::beast::http;

// The served model name of the reference engines.
inline constexpr char kRouterTestModel[] = "tiny";

// tests/chaos/node: the node client and its package.json.
inline std::string NodeDir() { return std::string(BATON_SOURCE_DIR) + "/tests/chaos/node"; }

// The path of executable `name` on $PATH, or "".
inline std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/" + name;
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// "" when node and the openai package are ready; otherwise what is missing. Runs `npm ci`
// (under a lock: tests may run in parallel) when node_modules is missing.
inline std::string NodeSetup() {
  if (FindInPath("node").empty()) return "node not found on PATH: run scripts/install-deps";
  const std::string marker = NodeDir() + "/node_modules/openai/package.json";
  if (::access(marker.c_str(), R_OK) == 0) return "";
  if (FindInPath("npm").empty()) return "npm not found on PATH: run scripts/install-deps";
  UniqueFd lock(::open("/tmp/baton-chaos-npm-ci.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0666));
  if (lock.valid()) ::flock(lock.get(), LOCK_EX);
  if (::access(marker.c_str(), R_OK) == 0) return "";
  const std::string log = "/tmp/baton-chaos-npm-ci-" + std::to_string(::getpid()) + ".log";
  const std::string cmd =
      "npm ci --prefix '" + NodeDir() + "' --no-audit --no-fund > '" + log + "' 2>&1";
  if (std::system(cmd.c_str()) == 0 && ::access(marker.c_str(), R_OK) == 0) return "";
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return "`npm ci --prefix tests/chaos/node` failed (it needs the npm registry once; "
         "scripts/install-deps runs it): " +
         text.str().substr(0, 2000);
}

// A child process; stdin and stdout are pipes when `piped`, else /dev/null and `log`;
// stderr goes to `log`. Killed and reaped when it goes.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log, bool piped) {
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    if (piped && (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (piped) {
      posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
      posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    } else {
      posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                       O_WRONLY | O_CREAT | O_APPEND, 0644);
    }
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) pid_ = 0;
    if (piped) {
      ::close(in[0]);
      ::close(out[1]);
      in_ = UniqueFd(in[1]);
      out_ = UniqueFd(out[0]);
    }
  }
  ~Child() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
    Wait(std::chrono::seconds(10));
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }  // 0 once reaped
  bool Running() {
    if (pid_ <= 0) return false;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) != pid_) return true;
    pid_ = 0;
    code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return false;
  }
  // Waits for the exit (SIGKILL after `limit`); the exit status, 128 + signal when killed.
  int Wait(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (Running() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
      pid_ = 0;
      code_ = 128 + SIGKILL;
    }
    return code_;
  }
  void Signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // More stdout bytes into buffer(); false at EOF or when `limit` passed with nothing.
  bool ReadMore(std::chrono::milliseconds limit) {
    pollfd p{out_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(out_.get(), buf, sizeof(buf));
    if (n <= 0) return false;
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }
  // The next line of stdout (without the newline); nullopt at EOF or after `limit`.
  std::optional<std::string> ReadLine(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    size_t nl;
    while ((nl = buffer_.find('\n')) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !ReadMore(left)) return std::nullopt;
    }
    std::string line = buffer_.substr(0, nl);
    buffer_.erase(0, nl + 1);
    return line;
  }
  void WriteLine(const std::string& line) {
    const std::string bytes = line + "\n";
    (void)!::write(in_.get(), bytes.data(), bytes.size());
  }
  const std::string& buffer() const { return buffer_; }

 private:
  pid_t pid_ = 0;
  int code_ = -1;
  UniqueFd in_, out_;
  std::string buffer_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The last `lines` lines of `text`.
inline std::string Tail(const std::string& text, int lines) {
  size_t pos = text.size();
  for (int n = 0; n <= lines && pos != std::string::npos && pos > 0; ++n) {
    pos = text.rfind('\n', pos - 1);
  }
  return pos == std::string::npos || pos == 0 ? text : text.substr(pos + 1);
}

struct Reply {
  int status = 0;  // 0: no complete response
  std::string body;
  std::string error;
};

// One request on a new connection to `ip`:`port`, read whole (a stream to its end).
inline Reply Fetch(const std::string& ip, uint16_t port, http::verb method,
                   const std::string& target, const std::string& body,
                   std::chrono::seconds timeout = std::chrono::seconds(60)) {
  Reply reply;
  try {
    boost::asio::io_context io;
    boost::beast::tcp_stream stream(io);
    stream.expires_after(timeout);
    stream.connect({boost::asio::ip::make_address(ip), port});
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, ip);
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    http::write(stream, req);
    boost::beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    http::read(stream, buffer, parser);
    reply.status = parser.get().result_int();
    reply.body = parser.get().body();
  } catch (const std::exception& e) {
    reply.error = e.what();
  }
  return reply;
}

// The same to 127.0.0.1.
inline Reply Fetch(uint16_t port, http::verb method, const std::string& target,
                   const std::string& body,
                   std::chrono::seconds timeout = std::chrono::seconds(60)) {
  return Fetch("127.0.0.1", port, method, target, body, timeout);
}

// A port free on 127.0.0.1 now, below the ephemeral range (tests/support/free_port.h).
inline uint16_t FreePort() { return static_cast<uint16_t>(testing_support::FreePort()); }

// The value of the series `name{labels}` (written exactly as /metrics writes it) in the
// router's /metrics on `port`; -1 when absent.
inline double MetricValue(uint16_t port, const std::string& series) {
  const Reply r = Fetch(port, http::verb::get, "/metrics", "", std::chrono::seconds(10));
  std::istringstream lines(r.body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::atof(line.c_str() + series.size() + 1);
  }
  return -1;
}

// build/bin/baton-router on a free loopback port, subscribed to `socket`, or started with
// `args` (`--etcd ...` for a router that follows a fleet) and logging to DIR/`log_name`, run
// through `wrapper` when given (setpriv, to run it as another user); the constructor waits
// until it knows a primary (/health 200).
class RouterProcess {
 public:
  RouterProcess(const std::string& socket, const std::string& dir)
      : RouterProcess(std::vector<std::string>{"--controller", socket}, dir, "router.log") {}
  RouterProcess(const std::vector<std::string>& args, const std::string& dir,
                const std::string& log_name, const std::vector<std::string>& wrapper = {})
      : log_(dir + "/" + log_name) {
    for (int attempt = 0; attempt < 3 && !ready_; ++attempt) {
      port_ = FreePort();
      std::vector<std::string> argv = wrapper;
      for (const std::string& a : {std::string(BATON_BIN_DIR) + "/baton-router",
                                   std::string("--listen"), "127.0.0.1:" + std::to_string(port_)}) {
        argv.push_back(a);
      }
      argv.insert(argv.end(), args.begin(), args.end());
      child_ = std::make_unique<Child>(argv, log_, /*piped=*/false);
      for (int i = 0; i < 2000 && child_->Running() && !ready_; ++i) {
        ready_ =
            Fetch(port_, http::verb::get, "/health", "", std::chrono::seconds(2)).status == 200;
        if (!ready_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
  ~RouterProcess() {
    child_->Signal(SIGTERM);
    EXPECT_EQ(child_->Wait(std::chrono::seconds(10)), 0) << "baton-router did not stop cleanly\n"
                                                         << Log();
  }
  bool ready() const { return ready_; }
  bool Running() { return child_->Running(); }
  // Sends `sig` (SIGHUP: the engine key file read again) without waiting.
  void Signal(int sig) { child_->Signal(sig); }
  // Sends `sig` and waits for the exit (SIGKILL after `limit`); its exit status.
  int Stop(int sig, std::chrono::milliseconds limit) {
    child_->Signal(sig);
    return child_->Wait(limit);
  }
  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  // The log's last lines.
  std::string Log() const { return Tail(ReadFile(log_), 40); }

 private:
  std::string log_;
  std::unique_ptr<Child> child_;
  uint16_t port_ = 0;
  bool ready_ = false;
};

// `program` with the flags every engine of this project takes, the controller's placeholders
// in them, serving the model as kRouterTestModel.
inline std::vector<std::string> EngineCommand(const std::string& program) {
  return {program,         "--model",
          "{model_dir}",   "--port",
          "{port}",        "--controller",
          "{socket}",      "--token",
          "{token}",       "--role",
          "{role}",        "--engine-id",
          "{engine_id}",   "--served-model-name",
          kRouterTestModel};
}

inline ClusterOptions RefenginePair() {
  ClusterOptions o;
  o.engine_command = EngineCommand(std::string(BATON_BIN_DIR) + "/baton-refengine");
  o.blocks = 512;  // 64 KiB blocks of 127 tokens of the tiny model
  return o;
}

// A step of the tiny model takes well under a millisecond: a whole stream ends before
// `batonctl drill kill` can land mid-way on a fast machine. A paced pair's engines decode
// a step at most every `step_ms` (`--step-interval-ms`), which changes when each token comes,
// never which token: a 48-token stream lasts over a second whatever the CPU.
inline constexpr int kPacedStepMs = 25;
inline ClusterOptions PacedRefenginePair(int step_ms = kPacedStepMs) {
  ClusterOptions o = RefenginePair();
  o.engine_command.insert(o.engine_command.end(), {"--step-interval-ms", std::to_string(step_ms)});
  return o;
}

struct StreamOutput {
  std::string text;
  json token_ids = json::array();
  std::set<std::string> ids;
  std::set<int64_t> created;
  bool done = false;
  std::string error;
};

// The text, token ids and chunk ids of a server-sent-event completion body.
inline StreamOutput ParseStream(const std::string& body) {
  StreamOutput out;
  size_t pos = 0, end;
  while ((end = body.find("\n\n", pos)) != std::string::npos) {
    std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;
    event = event.substr(6);
    if (out.done) out.error = "an event after [DONE]: " + event;
    if (event == "[DONE]") {
      out.done = true;
      continue;
    }
    const json j = json::parse(event, nullptr, false);
    if (!j.is_object() || j.contains("error") || !j.contains("choices")) {
      out.error = "event: " + event;
      continue;
    }
    out.ids.insert(j.value("id", ""));
    out.created.insert(j.value("created", int64_t{0}));
    out.text += j["choices"][0].value("text", "");
    for (const json& id : j["choices"][0].value("token_ids", json::array())) {
      out.token_ids.push_back(id);
    }
  }
  if (!out.done && out.error.empty()) out.error = "no [DONE]";
  return out;
}

// The same for a non-streaming completion.
inline StreamOutput ParseWhole(const std::string& body) {
  StreamOutput out;
  const json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("choices")) {
    out.error = "not a completion: " + body.substr(0, 300);
    return out;
  }
  out.text = j["choices"][0].value("text", "");
  out.token_ids = j["choices"][0].value("token_ids", json::array());
  out.done = true;
  return out;
}

}  // namespace baton::chaos
