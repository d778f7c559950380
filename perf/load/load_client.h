// LoadClient: the cheap HTTP/1.1 client of the router load drivers (baton-perf-router-overhead,
// baton-perf-failover-load). One keep-alive TCP connection, opened on first use and opened
// again when the server closed it while idle (checked before each request, so a connection
// the server dropped between requests never counts as a failed request); a POST with a JSON
// body; the response read whole, framed by Content-Length or chunked encoding. Every read and
// write has a timeout.
//
// ParseCompletion() turns a completion or chat completion body (one JSON object, or a
// server-sent-event stream of chunks) into its text, token ids and stream facts (chunk count,
// [DONE], error events, the chunk ids and `created` values seen), to compare outputs with a
// reference.
//
// Ownership: the client owns its socket (UniqueFd). Thread: one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/io/unique_fd.h"

namespace baton::perf {

struct LoadReply {
  int status = 0;           // HTTP status; 0 when no complete response came (see error)
  std::string body;         // the whole body (chunked encoding removed)
  std::string error;        // a transport failure; empty when the response is complete
  bool got_header = false;  // the status line and headers arrived (a stream may break later)
  std::string retry_after;  // the Retry-After header, if any
};

class LoadClient {
 public:
  // `address` is "A.B.C.D:PORT"; `timeout` bounds each connect, read and write.
  explicit LoadClient(std::string address,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // POSTs `json_body` to `path`, reconnecting first when needed. With `body_started`, sets it
  // once the first bytes of the response body have arrived (a stream's first events).
  // With `on_chunk`, calls it with each chunk of a chunked body as it arrives (a stream
  // relayed whole event by event gives one event per chunk).
  LoadReply Post(std::string_view path, std::string_view json_body,
                 std::atomic<bool>* body_started = nullptr,
                 std::function<void(std::string_view chunk)> on_chunk = {});
  // GETs `path`.
  LoadReply Get(std::string_view path);
  // Sent as `Authorization` with every later request ("" sends none): a Bearer engine key.
  void SetAuthorization(std::string value) { authorization_ = std::move(value); }
  // Closes the connection (the next call opens a new one).
  void Close() { fd_.Reset(); }

 private:
  LoadReply RoundTrip(const std::string& request, std::atomic<bool>* body_started,
                      std::function<void(std::string_view)> on_chunk = {});
  bool EnsureConnected(std::string* error);
  bool ReadMore(std::string* error);
  bool ReadBody(const std::string& head, LoadReply* reply);

  std::string address_;
  std::chrono::milliseconds timeout_;
  UniqueFd fd_;
  std::string authorization_;
  std::string buffer_;  // bytes read past the last response
  std::function<void(std::string_view)> on_chunk_;
  std::atomic<bool>* body_started_ = nullptr;  // set by ReadMore while a body is read
};

struct CompletionOutput {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<int32_t> prompt_token_ids;
  std::string finish_reason;
  int chunks = 0;             // stream: data events before [DONE]
  bool done_marker = false;   // stream: ended with data: [DONE]
  std::set<std::string> ids;  // the `id` of every chunk (one for an uninterrupted stream)
  std::set<int64_t> created;
  std::string error;  // an error event or object, or what could not be parsed; empty if none
};

// Parses a completion body; `stream` says whether it is a server-sent-event stream.
CompletionOutput ParseCompletion(const std::string& body, bool stream);

// The payloads of the complete `data:` events of a server-sent-event body.
std::vector<std::string> SseEvents(std::string_view body);

// A loopback port that was free a moment ago (bind to port 0, read it, close).
uint16_t FreeLoopbackPort();

}  // namespace baton::perf
