// Test helpers for baton-refengine: the engine binary run as a child process, with its log
// captured in a file and its HTTP port read from --port-file.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace baton {

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// An environment variable set for as long as the scope lasts (the engines it starts inherit
// it, as those a controller launches get BATON_ENGINE_KEYS), then unset.
class ScopedEnvVariable {
 public:
  ScopedEnvVariable(std::string name, const std::string& value) : name_(std::move(name)) {
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  ~ScopedEnvVariable() { ::unsetenv(name_.c_str()); }
  ScopedEnvVariable(const ScopedEnvVariable&) = delete;
  ScopedEnvVariable& operator=(const ScopedEnvVariable&) = delete;

 private:
  const std::string name_;
};

// baton-refengine started with `args` plus --port 0 --port-file DIR/port, logging to
// DIR/engine.log. With `wait_for_port`, the constructor returns once the engine listens.
// SIGTERM and reaped on Stop() or destruction.
class EngineProcess {
 public:
  EngineProcess(const std::string& dir, std::vector<std::string> args, bool wait_for_port = true)
      : log_(dir + "/engine.log"), port_file_(dir + "/port") {
    const std::string bin = std::string(BATON_BIN_DIR) + "/baton-refengine";
    if (::access(bin.c_str(), X_OK) != 0) {
      ADD_FAILURE() << bin << " is missing; build the baton-refengine target";
      return;
    }
    ::unlink(port_file_.c_str());
    args.insert(args.begin(), bin);
    for (const char* a : {"--port", "0", "--port-file"}) args.push_back(a);
    args.push_back(port_file_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    if (wait_for_port) WaitForPort();
  }
  ~EngineProcess() { Stop(); }
  EngineProcess(const EngineProcess&) = delete;
  EngineProcess& operator=(const EngineProcess&) = delete;

  // Waits (up to a minute) for the port file; false when the engine exited or never wrote it.
  bool WaitForPort() {
    for (int i = 0; i < 6000 && port_ == 0; ++i) {
      if (Exited()) {
        ADD_FAILURE() << "the engine exited early (status " << status_ << "):\n" << log();
        return false;
      }
      std::ifstream in(port_file_);
      int port = 0;
      if (in >> port) port_ = static_cast<uint16_t>(port);
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (port_ == 0) ADD_FAILURE() << "the engine never wrote its port:\n" << log();
    return port_ != 0;
  }

  // Waits (up to a minute) for the engine to exit by itself; its exit status, or -1.
  int WaitForExit() {
    for (int i = 0; i < 6000 && !Exited(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pid_ > 0 ? -1 : status_;
  }

  // SIGTERM, then the exit status (-1 when it did not exit normally).
  int Stop() {
    if (pid_ <= 0) return status_;
    ::kill(pid_, SIGTERM);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return status_;
  }

  uint16_t port() const { return port_; }
  std::string log() const { return ReadWholeFile(log_); }
  // Waits (up to a minute) until the log contains `text`.
  bool WaitForLog(const std::string& text) const {
    for (int i = 0; i < 6000; ++i) {
      if (log().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  bool Exited() {
    if (pid_ <= 0) return true;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) != pid_) return false;
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return true;
  }

  std::string log_;
  std::string port_file_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  int status_ = -1;
};

}  // namespace baton
