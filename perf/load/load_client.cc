#include "perf/load/load_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>

#include "perf/pair/failover_http.h"

namespace baton::perf {
namespace {

using nlohmann::json;

bool ParseSize(std::string_view text, int base, size_t* out) {
  const size_t semi = text.find(';');  // chunk extensions
  if (semi != std::string_view::npos) text = text.substr(0, semi);
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), *out, base);
  return ec == std::errc() && p != text.data();
}

void SetTimeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// Appends a JSON array of integers to `out`; false when it is not one.
bool AppendIds(const json& a, std::vector<int32_t>* out) {
  if (!a.is_array()) return false;
  for (const json& id : a) {
    if (!id.is_number_integer()) return false;
    out->push_back(id.get<int32_t>());
  }
  return true;
}

// Folds one completion object (a whole response or one stream chunk) into `out`.
void FoldChoice(const json& j, CompletionOutput* out) {
  if (j.contains("error")) {
    out->error = "error: " + j["error"].dump();
    return;
  }
  if (j.contains("id") && j["id"].is_string()) out->ids.insert(j["id"].get<std::string>());
  if (j.contains("created") && j["created"].is_number_integer()) {
    out->created.insert(j["created"].get<int64_t>());
  }
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
  const json& c = j["choices"][0];
  if (c.contains("text") && c["text"].is_string()) out->text += c["text"].get<std::string>();
  // Chat: a stream chunk's delta, a whole answer's message; the prompt's ids at the top.
  for (const char* part : {"delta", "message"}) {
    if (c.contains(part) && c[part].is_object() && c[part].contains("content") &&
        c[part]["content"].is_string()) {
      out->text += c[part]["content"].get<std::string>();
    }
  }
  if (j.contains("prompt_token_ids")) AppendIds(j["prompt_token_ids"], &out->prompt_token_ids);
  if (c.contains("token_ids") && !AppendIds(c["token_ids"], &out->token_ids)) {
    out->error = "token_ids is not an array of integers";
  }
  if (c.contains("prompt_token_ids")) AppendIds(c["prompt_token_ids"], &out->prompt_token_ids);
  if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
    out->finish_reason = c["finish_reason"].get<std::string>();
  }
}

}  // namespace

LoadClient::LoadClient(std::string address, std::chrono::milliseconds timeout)
    : address_(std::move(address)), timeout_(timeout) {}

bool LoadClient::EnsureConnected(std::string* error) {
  if (fd_.valid()) {
    // A keep-alive connection the server closed while idle reads as EOF (or has stray bytes):
    // open a fresh one rather than send into it.
    pollfd p{fd_.get(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) == 0) return true;
    fd_.Reset();
    buffer_.clear();
  }
  const size_t colon = address_.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  size_t port = 0;
  if (colon == std::string::npos ||
      !ParseSize(std::string_view(address_).substr(colon + 1), 10, &port) || port == 0 ||
      port > 65535 || ::inet_pton(AF_INET, address_.substr(0, colon).c_str(), &sa.sin_addr) != 1) {
    *error = "not a numeric IPv4 HOST:PORT address: " + address_;
    return false;
  }
  sa.sin_port = htons(static_cast<uint16_t>(port));
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    *error = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  SetTimeouts(fd.get(), timeout_);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    *error = "connect " + address_ + ": " + std::strerror(errno);
    return false;
  }
  fd_ = std::move(fd);
  buffer_.clear();
  return true;
}

bool LoadClient::ReadMore(std::string* error) {
  char chunk[16384];
  for (;;) {
    const ssize_t n = ::recv(fd_.get(), chunk, sizeof(chunk), 0);
    if (n > 0) {
      buffer_.append(chunk, static_cast<size_t>(n));
      if (body_started_ != nullptr) body_started_->store(true);
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      *error = "the connection was closed";
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      *error = "read timed out";
    } else {
      *error = std::string("recv: ") + std::strerror(errno);
    }
    return false;
  }
}

bool LoadClient::ReadBody(const std::string& head, LoadReply* reply) {
  const std::string_view length = HeaderValue(head, "Content-Length");
  if (!length.empty()) {
    size_t n = 0;
    if (!ParseSize(length, 10, &n)) {
      reply->error = "bad Content-Length";
      return false;
    }
    while (buffer_.size() < n) {
      if (!ReadMore(&reply->error)) return false;
    }
    reply->body = buffer_.substr(0, n);
    buffer_.erase(0, n);
    return true;
  }
  if (HeaderValue(head, "Transfer-Encoding").find("chunked") == std::string_view::npos) {
    while (ReadMore(&reply->error)) {  // framed by the end of the connection
    }
    reply->body = std::move(buffer_);
    buffer_.clear();
    fd_.Reset();
    if (reply->error != "the connection was closed") return false;
    reply->error.clear();
    return true;
  }
  for (;;) {
    size_t eol;
    while ((eol = buffer_.find("\r\n")) == std::string::npos) {
      if (!ReadMore(&reply->error)) return false;
    }
    size_t size = 0;
    if (!ParseSize(std::string_view(buffer_).substr(0, eol), 16, &size)) {
      reply->error = "bad chunk size";
      return false;
    }
    if (size == 0) {  // the last chunk, then trailers up to an empty line
      size_t end;
      while ((end = buffer_.find("\r\n\r\n", eol)) == std::string::npos) {
        if (!ReadMore(&reply->error)) return false;
      }
      buffer_.erase(0, end + 4);
      return true;
    }
    while (buffer_.size() < eol + 2 + size + 2) {
      if (!ReadMore(&reply->error)) return false;
    }
    reply->body.append(buffer_, eol + 2, size);
    if (on_chunk_) on_chunk_(std::string_view(buffer_).substr(eol + 2, size));
    buffer_.erase(0, eol + 2 + size + 2);
  }
}

LoadReply LoadClient::RoundTrip(const std::string& request, std::atomic<bool>* body_started,
                                std::function<void(std::string_view)> on_chunk) {
  LoadReply reply;
  on_chunk_ = std::move(on_chunk);
  body_started_ = nullptr;
  if (!EnsureConnected(&reply.error)) return reply;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd_.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      reply.error = std::string("send: ") + std::strerror(errno);
      fd_.Reset();
      return reply;
    }
    sent += static_cast<size_t>(n);
  }
  size_t head_end;
  while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (!ReadMore(&reply.error)) {
      fd_.Reset();
      return reply;
    }
  }
  const std::string head = buffer_.substr(0, head_end + 2);
  buffer_.erase(0, head_end + 4);
  size_t status = 0;
  if (head.size() < 12 || head.compare(0, 5, "HTTP/") != 0 ||
      !ParseSize(std::string_view(head).substr(9, 3), 10, &status)) {
    reply.error = "not an HTTP response: " + head.substr(0, 40);
    fd_.Reset();
    return reply;
  }
  reply.got_header = true;
  reply.retry_after = std::string(HeaderValue(head, "Retry-After"));
  body_started_ = body_started;
  if (body_started_ != nullptr && !buffer_.empty()) body_started_->store(true);
  const bool complete = ReadBody(head, &reply);
  body_started_ = nullptr;
  on_chunk_ = nullptr;
  if (!complete) {
    fd_.Reset();
    return reply;  // status stays 0: the response is incomplete
  }
  reply.status = static_cast<int>(status);
  if (HeaderValue(head, "Connection").find("close") != std::string_view::npos) fd_.Reset();
  return reply;
}

LoadReply LoadClient::Post(std::string_view path, std::string_view json_body,
                           std::atomic<bool>* body_started,
                           std::function<void(std::string_view chunk)> on_chunk) {
  std::string request;
  request.reserve(160 + path.size() + json_body.size());
  request.append("POST ").append(path).append(" HTTP/1.1\r\nHost: ").append(address_);
  if (!authorization_.empty()) request.append("\r\nAuthorization: ").append(authorization_);
  request.append("\r\nContent-Type: application/json\r\nContent-Length: ");
  request.append(std::to_string(json_body.size())).append("\r\n\r\n").append(json_body);
  return RoundTrip(request, body_started, std::move(on_chunk));
}

LoadReply LoadClient::Get(std::string_view path) {
  return RoundTrip("GET " + std::string(path) + " HTTP/1.1\r\nHost: " + address_ + "\r\n\r\n",
                   nullptr);
}

std::vector<std::string> SseEvents(std::string_view body) {
  std::vector<std::string> events;
  size_t pos = 0;
  for (;;) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string_view::npos) break;
    std::string_view event = body.substr(pos, end - pos);
    pos = end + 2;
    std::string data;  // the data lines of the event, joined with \n
    size_t line_start = 0;
    while (line_start <= event.size()) {
      size_t nl = event.find('\n', line_start);
      if (nl == std::string_view::npos) nl = event.size();
      std::string_view line = event.substr(line_start, nl - line_start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.rfind("data:", 0) == 0) {
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (!data.empty()) data += '\n';
        data.append(line);
      }
      line_start = nl + 1;
    }
    if (!data.empty()) events.push_back(std::move(data));
  }
  return events;
}

CompletionOutput ParseCompletion(const std::string& body, bool stream) {
  CompletionOutput out;
  if (!stream) {
    const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      out.error = "not a JSON object: " + body.substr(0, 120);
    } else {
      FoldChoice(j, &out);
    }
    return out;
  }
  for (const std::string& event : SseEvents(body)) {
    if (out.done_marker) {
      out.error = "an event after [DONE]";
      break;
    }
    if (event == "[DONE]") {
      out.done_marker = true;
      continue;
    }
    const json j = json::parse(event, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      out.error = "an event that is not a JSON object: " + event.substr(0, 120);
      break;
    }
    ++out.chunks;
    FoldChoice(j, &out);
    if (!out.error.empty()) break;
  }
  if (out.error.empty() && !out.done_marker) out.error = "the stream ended without [DONE]";
  return out;
}

uint16_t FreeLoopbackPort() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    return 0;
  }
  return ntohs(sa.sin_port);
}

}  // namespace baton::perf
