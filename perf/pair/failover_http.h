// HttpClient: a blocking HTTP/1.1 client over one keep-alive TCP connection, for
// baton-perf-failover's probes and completions. It speaks just enough HTTP for the
// reference engine: GET and POST with a JSON body, responses framed by Content-Length or
// chunked encoding. Every read and write has a timeout, so a dead peer shows up as an error.
//
// Ownership: the client owns its socket (UniqueFd). Thread: one thread at a time.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "base/io/unique_fd.h"
#include "base/status.h"

namespace baton::perf {

struct HttpResponse {
  int status = 0;
  std::string body;
};

class HttpClient {
 public:
  // Connects to "HOST:PORT" (numeric IPv4); `timeout` bounds each read and write.
  static Result<HttpClient> Connect(std::string_view address,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(30));

  Result<HttpResponse> Get(std::string_view path);
  Result<HttpResponse> Post(std::string_view path, std::string_view json_body);

 private:
  HttpClient(UniqueFd fd, std::string host) : fd_(std::move(fd)), host_(std::move(host)) {}
  Result<HttpResponse> RoundTrip(const std::string& request);
  Status ReadMore();
  Result<std::string> ReadChunked();

  UniqueFd fd_;
  std::string host_;
  std::string buffer_;  // bytes read past the last response
};

// The value of header `name` (case-insensitive) in `head` (status line + headers), without
// surrounding blanks, or "".
std::string_view HeaderValue(std::string_view head, std::string_view name);

}  // namespace baton::perf
