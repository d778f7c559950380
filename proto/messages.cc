#include "proto/messages.h"

namespace baton::proto {

bool IsKnownMsgType(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
#define BATON_PROTO_CASE(name, number) case MsgType::k##name:
    BATON_PROTO_MESSAGES(BATON_PROTO_CASE)
#undef BATON_PROTO_CASE
    return true;
  }
  return false;
}

std::string MsgTypeName(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
#define BATON_PROTO_CASE(name, number) \
  case MsgType::k##name:               \
    return #name;
    BATON_PROTO_MESSAGES(BATON_PROTO_CASE)
#undef BATON_PROTO_CASE
  }
  return "unknown type " + std::to_string(type);
}

const char* ToString(ReattachRole role) {
  switch (role) {
    case ReattachRole::kStandby:
      return "standby";
    case ReattachRole::kPromoted:
      return "promoted";
    case ReattachRole::kServing:
      return "serving";
    case ReattachRole::kDraining:
      return "draining";
    case ReattachRole::kDrained:
      return "drained";
  }
  return "unknown";
}

ErrorMsg ErrorMsg::FromStatus(const Status& status) {
  return ErrorMsg{.code = static_cast<uint32_t>(status.code()), .message = status.message()};
}

Status ErrorMsg::ToStatus() const {
  const auto max_code = static_cast<uint32_t>(StatusCode::kIoError);
  if (code == 0 || code > max_code) {
    return Internal("peer error (code " + std::to_string(code) + "): " + message);
  }
  return Status(static_cast<StatusCode>(code), message);
}

namespace {

template <typename T>
Result<AnyMessage> DecodeInto(std::string_view payload) {
  Result<T> msg = Decode<T>(payload);
  if (!msg.ok()) return msg.status();
  return AnyMessage(std::move(msg).value());
}

}  // namespace

Result<AnyMessage> DecodeAny(uint16_t type, std::string_view payload) {
  switch (static_cast<MsgType>(type)) {
#define BATON_PROTO_CASE(name, number) \
  case MsgType::k##name:               \
    return DecodeInto<name>(payload);
    BATON_PROTO_MESSAGES(BATON_PROTO_CASE)
#undef BATON_PROTO_CASE
  }
  return InvalidArgument("unknown message type " + std::to_string(type));
}

}  // namespace baton::proto
