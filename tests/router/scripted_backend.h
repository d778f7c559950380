// ScriptedBackend: a loopback HTTP backend that answers its k-th connection's one request
// with the k-th scripted raw response (all bytes at once, then it closes), and keeps each
// request's body for the test to inspect. Test support (header-only); one thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/io/unique_fd.h"
#include "tests/router/loopback_listener.h"

namespace baton {

class ScriptedBackend {
 public:
  explicit ScriptedBackend(std::vector<std::string> responses) : responses_(std::move(responses)) {
    if (listener_.port() == 0) return;
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedBackend() {
    listener_.Shutdown();
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return listener_.port(); }
  std::vector<std::string> bodies() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }

  // A chunked text/event-stream response carrying `events` (each "data: ...\n\n"), one
  // chunk per event as an engine writes them.
  static std::string Stream(const std::vector<std::string>& events) {
    return Chunked("text/event-stream", events);
  }
  // A 200 response of `content_type` sent with chunked encoding, one chunk per piece.
  static std::string Chunked(const std::string& content_type,
                             const std::vector<std::string>& pieces) {
    std::string out = "HTTP/1.1 200 OK\r\nContent-Type: " + content_type +
                      "\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    for (const std::string& e : pieces) {
      char size[32];
      std::snprintf(size, sizeof(size), "%zx\r\n", e.size());
      out += size + e + "\r\n";
    }
    return out + "0\r\n\r\n";
  }

 private:
  void Serve() {
    for (const std::string& response : responses_) {
      UniqueFd conn(::accept(listener_.fd(), nullptr, nullptr));
      if (!conn.valid()) return;
      std::string in;
      char buf[4096];
      size_t end = std::string::npos;
      while ((end = in.find("\r\n\r\n")) == std::string::npos ||
             in.size() < end + 4 + BodyLength(in.substr(0, end))) {
        const ssize_t n = ::recv(conn.get(), buf, sizeof(buf), 0);
        if (n <= 0) return;
        in.append(buf, static_cast<size_t>(n));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        bodies_.push_back(in.substr(end + 4));
      }
      (void)!::send(conn.get(), response.data(), response.size(), MSG_NOSIGNAL);
      ::shutdown(conn.get(), SHUT_WR);
      while (::recv(conn.get(), buf, sizeof(buf), 0) > 0) {
      }
    }
  }
  static size_t BodyLength(const std::string& head) {
    const size_t at = head.find("Content-Length: ");
    return at == std::string::npos ? 0 : std::stoul(head.substr(at + 16));
  }

  const std::vector<std::string> responses_;
  LoopbackListener listener_;
  mutable std::mutex mu_;
  std::vector<std::string> bodies_;
  std::thread thread_;
};

}  // namespace baton
