// Hello: the first exchange on every connection, which agrees on a protocol version and says
// what the client is (PeerRole, proto/roles.h).
//
// The client sends Hello with the range of versions it speaks; the server answers HelloAck
// with the highest version both speak, or HelloReject with a reason (no common version, a
// first message that is not a Hello, a role that names none, or a refusal by the server's
// admission check, e.g. a wrong launch token) and closes the connection. Both sides record
// the agreed version on the Channel. Blocking calls; use from the channel's owning thread.
// AnswerHello() serves a Hello already received by AsyncReceive, for servers that never block.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "proto/messages.h"
#include "proto/roles.h"
#include "proto/transport/channel.h"

namespace baton::proto {

struct ClientHelloOptions {
  std::string peer_name = {};
  PeerRole role = PeerRole::kEngine;
  std::string launch_token = {};
  uint16_t min_version = kProtocolVersionMin;
  uint16_t max_version = kProtocolVersionMax;
  Duration timeout = std::chrono::seconds(5);
};

// Sends Hello and waits for the answer. A HelloReject is FailedPrecondition with its reason
// (and closes the channel).
Result<HelloAck> ClientHello(Channel& channel, const ClientHelloOptions& options);

struct ServerHelloOptions {
  std::string server_name = {};
  uint16_t min_version = kProtocolVersionMin;
  uint16_t max_version = kProtocolVersionMax;
  Duration timeout = std::chrono::seconds(5);
  // Optional admission check run after the versions agree; a non-OK status refuses the peer
  // with the status's message as the reason.
  std::function<Status(const Hello&)> admit = {};
};

struct AcceptedHello {
  Hello hello;
  uint16_t version = 0;
};

// Waits for the client's Hello and answers it.
Result<AcceptedHello> ServerHello(Channel& channel, const ServerHelloOptions& options);
// Answers `first`, the first message received on `channel`.
Result<AcceptedHello> AnswerHello(Channel& channel, const ReceivedMessage& first,
                                  const ServerHelloOptions& options);

// The highest version in both ranges, or FailedPrecondition naming both ranges.
Result<uint16_t> NegotiateVersion(uint16_t peer_min, uint16_t peer_max, uint16_t our_min,
                                  uint16_t our_max);

}  // namespace baton::proto
