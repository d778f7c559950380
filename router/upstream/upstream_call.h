// UpstreamCall: one attempt of a request on one engine, over HTTP/1.1 (Boost.Beast, async).
//
// The request goes out with the given method, target and body (and the client's
// Content-Type and Accept, and the router's Authorization for engines: EngineKeySource). What comes
// back is handed to the owner's callbacks as it arrives: the status line and headers (OnHead), then
// each piece of the body as read (OnData, never buffered whole), then the end (OnEnd, exactly once,
// also after Cancel()). An UpstreamError says what failed: connecting (the engine was never
// reached, so a retry cannot duplicate anything), a timeout (connect, first byte, or idle between
// body reads), or a broken response.
//
// With a pool, the call first takes an idle keep-alive connection to the address and puts
// its connection back after a clean keep-alive response. When a connection from the pool
// fails before any byte of the response (the engine had closed it), the call retries once
// on a fresh connection, unseen by the owner. If that connection cannot be made (the engine
// is gone, and may have had the request), the call ends with the first failure (broken), not
// as a refused connection.
//
// Ownership: the call owns its socket and keeps itself alive (shared_ptr) until OnEnd.
// Thread: runs on the executor it is given (the request's strand); callbacks run there, and
// Cancel() must be called there too.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "proto/http/http_server.h"
#include "router/upstream/upstream_pool.h"

namespace baton {

struct UpstreamTimeouts {
  std::chrono::milliseconds connect{2000};
  std::chrono::milliseconds first_byte{60000};
  std::chrono::milliseconds idle{60000};
};

enum class UpstreamError {
  kNone,
  kConnect,           // refused, unreachable, or the connect timed out: nothing reached it
  kFirstByteTimeout,  // sent, but no response header in time
  kIdleTimeout,       // the body stalled
  kBroken,            // reset or closed before the response ended
  kCancelled,         // Cancel() was called
};

const char* UpstreamErrorName(UpstreamError e);

struct UpstreamRequest {
  boost::beast::http::verb method = boost::beast::http::verb::post;
  std::string target;
  std::string body;
  std::string content_type;
  std::string accept;
  std::string authorization = {};  // "Bearer KEY" (EngineKeySource::Header); "": none sent
};

struct UpstreamSink {
  // `streaming`: chunked or text/event-stream.
  std::function<void(int status, const std::string& content_type, bool streaming)> on_head;
  std::function<void(std::string_view bytes)> on_data;
  std::function<void(UpstreamError error, const std::string& message)> on_end;
};

class UpstreamCall {
 public:
  virtual ~UpstreamCall() = default;
  // Closes the connection; OnEnd follows with kCancelled unless the call already ended.
  virtual void Cancel() = 0;
};

// Starts the call to `address` ("HOST:PORT", numeric host). A bad address ends it at once
// (posted) with kConnect. `pool` may be null (a new connection each time, closed after).
std::shared_ptr<UpstreamCall> StartUpstreamCall(boost::asio::any_io_executor executor,
                                                const std::string& address, UpstreamRequest request,
                                                UpstreamTimeouts timeouts, UpstreamSink sink,
                                                UpstreamPool* pool = nullptr);

}  // namespace baton
