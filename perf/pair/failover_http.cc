#include "perf/pair/failover_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>

namespace baton::perf {
namespace {

Result<size_t> ParseSize(std::string_view text, int base) {
  size_t value = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (ec != std::errc() || p == text.data()) {
    return Internal("bad number in an HTTP response: '" + std::string(text) + "'");
  }
  return value;
}

}  // namespace

// The value of header `name` (case-insensitive) in `head` (status line + headers), or "".
std::string_view HeaderValue(std::string_view head, std::string_view name) {
  size_t pos = head.find("\r\n");
  while (pos != std::string_view::npos && pos + 2 < head.size()) {
    const size_t start = pos + 2;
    const size_t end = head.find("\r\n", start);
    std::string_view line = head.substr(start, end == std::string_view::npos ? end : end - start);
    const size_t colon = line.find(':');
    if (colon == name.size() && ::strncasecmp(line.data(), name.data(), name.size()) == 0) {
      std::string_view v = line.substr(colon + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
      return v;
    }
    pos = end;
  }
  return {};
}

Result<HttpClient> HttpClient::Connect(std::string_view address,
                                       std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) {
    return InvalidArgument("not a HOST:PORT address: " + std::string(address));
  }
  const std::string host(address.substr(0, colon));
  BATON_ASSIGN_OR_RETURN(size_t port, ParseSize(address.substr(colon + 1), 10));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (port == 0 || port > 65535 || ::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    return InvalidArgument("not a numeric IPv4 HOST:PORT address: " + std::string(address));
  }
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus("socket", errno);
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return ErrnoStatus("connect " + std::string(address), errno);
  }
  return HttpClient(std::move(fd), std::string(address));
}

Result<HttpResponse> HttpClient::Get(std::string_view path) {
  return RoundTrip("GET " + std::string(path) + " HTTP/1.1\r\nHost: " + host_ + "\r\n\r\n");
}

Result<HttpResponse> HttpClient::Post(std::string_view path, std::string_view json_body) {
  return RoundTrip("POST " + std::string(path) + " HTTP/1.1\r\nHost: " + host_ +
                   "\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(json_body.size()) + "\r\n\r\n" + std::string(json_body));
}

Status HttpClient::ReadMore() {
  char chunk[16384];
  for (;;) {
    const ssize_t n = ::recv(fd_.get(), chunk, sizeof(chunk), 0);
    if (n > 0) {
      buffer_.append(chunk, static_cast<size_t>(n));
      return OkStatus();
    }
    if (n == 0) return Unavailable(host_ + ": the connection was closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return DeadlineExceeded(host_ + ": read timed out");
    return ErrnoStatus("recv from " + host_, errno);
  }
}

Result<std::string> HttpClient::ReadChunked() {
  std::string body;
  for (;;) {
    size_t eol;
    while ((eol = buffer_.find("\r\n")) == std::string::npos) BATON_RETURN_IF_ERROR(ReadMore());
    BATON_ASSIGN_OR_RETURN(size_t size, ParseSize(buffer_.substr(0, eol), 16));
    while (buffer_.size() < eol + 2 + size + 2) BATON_RETURN_IF_ERROR(ReadMore());
    body.append(buffer_, eol + 2, size);
    buffer_.erase(0, eol + 2 + size + 2);
    if (size == 0) return body;  // no trailers from the reference engine
  }
}

Result<HttpResponse> HttpClient::RoundTrip(const std::string& request) {
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd_.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus("send to " + host_, errno);
    sent += static_cast<size_t>(n);
  }
  size_t head_end;
  while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    BATON_RETURN_IF_ERROR(ReadMore());
  }
  const std::string head = buffer_.substr(0, head_end + 2);
  buffer_.erase(0, head_end + 4);
  HttpResponse response;
  if (head.size() < 12 || head.compare(0, 5, "HTTP/") != 0) {
    return Internal(host_ + ": not an HTTP response: " + head.substr(0, 40));
  }
  BATON_ASSIGN_OR_RETURN(size_t status, ParseSize(std::string_view(head).substr(9, 3), 10));
  response.status = static_cast<int>(status);
  const std::string_view length = HeaderValue(head, "Content-Length");
  if (!length.empty()) {
    BATON_ASSIGN_OR_RETURN(size_t n, ParseSize(length, 10));
    while (buffer_.size() < n) BATON_RETURN_IF_ERROR(ReadMore());
    response.body = buffer_.substr(0, n);
    buffer_.erase(0, n);
  } else if (HeaderValue(head, "Transfer-Encoding").find("chunked") != std::string_view::npos) {
    BATON_ASSIGN_OR_RETURN(response.body, ReadChunked());
  } else {
    return Internal(host_ + ": a response with neither Content-Length nor chunked encoding");
  }
  return response;
}

}  // namespace baton::perf
