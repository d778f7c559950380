#include "router/stream/sse_splitter.h"

namespace baton {
namespace {

// End of the first complete event in `s` (one past its blank line), or npos.
size_t EventEnd(std::string_view s) {
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] != '\n') continue;
    if (s[i + 1] == '\n') return i + 2;
    if (s[i + 1] == '\r' && i + 2 < s.size() && s[i + 2] == '\n') return i + 3;
  }
  return std::string_view::npos;
}

}  // namespace

void SseSplitter::Feed(std::string_view bytes, std::vector<std::string>* events) {
  // Only the new bytes (and the last two old ones, for a blank line split across reads) can
  // complete an event.
  size_t scan_from = buffer_.size() >= 2 ? buffer_.size() - 2 : 0;
  buffer_.append(bytes);
  size_t start = 0;
  while (true) {
    const size_t from = std::max(start, scan_from);
    size_t end = EventEnd(std::string_view(buffer_).substr(from));
    if (end == std::string_view::npos) break;
    end += from;
    events->emplace_back(buffer_.substr(start, end - start));
    start = end;
    scan_from = end;
  }
  buffer_.erase(0, start);
}

std::optional<std::string> EventData(std::string_view event) {
  std::optional<std::string> data;
  size_t pos = 0;
  while (pos < event.size()) {
    size_t eol = event.find('\n', pos);
    if (eol == std::string_view::npos) eol = event.size();
    std::string_view line = event.substr(pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = eol + 1;
    if (line.substr(0, 5) != "data:") continue;
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (data) {
      *data += '\n';
      data->append(line);
    } else {
      data = std::string(line);
    }
  }
  return data;
}

}  // namespace baton
