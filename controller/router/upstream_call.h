// UpstreamCall: one client request relayed to an engine over HTTP/1.1 (Boost.Beast, async).
//
// The request goes out with its method, target and body unchanged. The response comes back
// through the client's HttpExchange: a chunked or `text/event-stream` response is relayed
// chunk by chunk as the bytes arrive (never buffered whole), any other one is sent as one
// response once complete. Failures before the response header reaches the client become
// OpenAI-shaped JSON errors: connect failure or connect timeout 502, no response header
// within `first_byte` 504, a broken response 502. A failure mid-stream ends the client's
// stream. A client that goes away cancels the upstream connection.
//
// Ownership: the call owns its upstream socket and keeps itself alive (shared_ptr) until it
// ends. Thread: runs on its own strand of the io_context; `done` is called there, once.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "standby/http_server.h"

namespace baton {

struct UpstreamTimeouts {
  std::chrono::milliseconds connect{2000};
  std::chrono::milliseconds first_byte{60000};
  std::chrono::milliseconds idle{60000};
};

// `status` is what the client got; `upstream_error` names the failure ("" when none).
using UpstreamDone = std::function<void(int status, const std::string& upstream_error)>;

// Relays `exchange`'s request to `address` ("HOST:PORT", numeric host).
void StartUpstreamCall(boost::asio::io_context& io, const std::string& address,
                       std::shared_ptr<HttpExchange> exchange, UpstreamTimeouts timeouts,
                       UpstreamDone done);

}  // namespace baton
