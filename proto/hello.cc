#include "proto/hello.h"

#include <algorithm>

#include "base/log.h"

namespace baton::proto {
namespace {

std::string RangeText(uint16_t lo, uint16_t hi) {
  return std::to_string(lo) + ".." + std::to_string(hi);
}

// Tells the client why, closes the channel, and returns the reason as FailedPrecondition.
Status Reject(Channel& channel, const std::string& reason) {
  BATON_LOG(WARN, "proto") << "refusing hello from " << channel.label() << ": " << reason;
  Status sent = channel.Send(HelloReject{.reason = reason});
  if (!sent.ok()) {
    BATON_LOG(DEBUG, "proto") << "could not send HelloReject: " << sent.ToString();
  }
  channel.Close();
  return FailedPrecondition(reason);
}

}  // namespace

Result<uint16_t> NegotiateVersion(uint16_t peer_min, uint16_t peer_max, uint16_t our_min,
                                  uint16_t our_max) {
  if (peer_min > peer_max) {
    return FailedPrecondition("protocol version range " + RangeText(peer_min, peer_max) +
                              " is empty");
  }
  const uint16_t lo = std::max(peer_min, our_min);
  const uint16_t hi = std::min(peer_max, our_max);
  if (lo > hi) {
    return FailedPrecondition("protocol version mismatch: peer speaks " +
                              RangeText(peer_min, peer_max) + ", this side speaks " +
                              RangeText(our_min, our_max));
  }
  return hi;
}

Result<HelloAck> ClientHello(Channel& channel, const ClientHelloOptions& options) {
  Hello hello{.min_version = options.min_version,
              .max_version = options.max_version,
              .peer_name = options.peer_name,
              .role = options.role,
              .launch_token = options.launch_token};
  BATON_RETURN_IF_ERROR(channel.Send(hello));
  BATON_ASSIGN_OR_RETURN(ReceivedMessage reply, channel.Receive(options.timeout));
  if (reply.type == MsgType::kHelloReject) {
    BATON_ASSIGN_OR_RETURN(HelloReject reject, reply.As<HelloReject>());
    channel.Close();
    return FailedPrecondition("hello refused by " + channel.label() + ": " + reject.reason);
  }
  Result<HelloAck> ack = reply.As<HelloAck>();
  if (!ack.ok()) {
    channel.CloseWithError(ack.status());
    return ack.status();
  }
  if (ack->version < options.min_version || ack->version > options.max_version) {
    Status bad =
        FailedPrecondition("server chose protocol version " + std::to_string(ack->version) +
                           ", outside " + RangeText(options.min_version, options.max_version));
    channel.CloseWithError(bad);
    return bad;
  }
  channel.set_version(ack->version);
  return ack;
}

Result<AcceptedHello> ServerHello(Channel& channel, const ServerHelloOptions& options) {
  BATON_ASSIGN_OR_RETURN(ReceivedMessage first, channel.Receive(options.timeout));
  return AnswerHello(channel, first, options);
}

Result<AcceptedHello> AnswerHello(Channel& channel, const ReceivedMessage& first,
                                  const ServerHelloOptions& options) {
  if (first.type != MsgType::kHello) {
    return Reject(channel, "expected Hello as the first message, got " + MsgTypeName(first.type));
  }
  Result<Hello> hello = first.As<Hello>();
  if (!hello.ok()) return Reject(channel, hello.status().message());
  Result<uint16_t> version = NegotiateVersion(hello->min_version, hello->max_version,
                                              options.min_version, options.max_version);
  if (!version.ok()) return Reject(channel, version.status().message());
  if (options.admit) {
    Status admitted = options.admit(*hello);
    if (!admitted.ok()) return Reject(channel, admitted.message());
  }
  BATON_RETURN_IF_ERROR(
      channel.Send(HelloAck{.version = *version, .server_name = options.server_name}));
  channel.set_version(*version);
  if (!hello->peer_name.empty()) {
    channel.set_label(hello->peer_name + " (" + channel.label() + ")");
  }
  // batonctl polls: a line per call at INFO would drown the state changes.
  if (hello->role == PeerRole::kCli) {
    BATON_LOG(DEBUG, "proto") << "hello from " << channel.label() << ", role cli, protocol version "
                              << *version;
  } else {
    BATON_LOG(INFO, "proto") << "hello from " << channel.label() << ", role "
                             << ToString(hello->role) << ", protocol version " << *version;
  }
  return AcceptedHello{.hello = std::move(hello).value(), .version = *version};
}

}  // namespace baton::proto
