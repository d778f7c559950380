// SseSplitter: cuts a server-sent-event byte stream into whole events.
//
// Bytes arrive in arbitrary pieces (TCP reads); Feed() keeps a partial event until its
// terminating blank line arrives ("\n\n" or "\r\n\r\n"), so the router forwards and inspects
// only whole events and never half of one. EventData() extracts an event's `data` field
// (several `data:` lines joined with "\n", one leading space dropped, as the SSE spec says).
//
// Plain value; thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

class SseSplitter {
 public:
  // Appends `bytes`; each event completed by them (with its blank line) goes to *events.
  void Feed(std::string_view bytes, std::vector<std::string>* events);
  // Bytes of an event not yet complete.
  size_t pending() const { return buffer_.size(); }

 private:
  std::string buffer_;
};

// The data of one event, or nullopt when it has no `data:` line (a comment, a keep-alive).
std::optional<std::string> EventData(std::string_view event);

}  // namespace baton
