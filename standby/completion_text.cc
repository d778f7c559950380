#include "standby/completion_text.h"

#include <algorithm>
#include <cstdint>

namespace baton {
namespace {

// Length of the valid UTF-8 sequence at s[p], or 0 when none starts there. *truncated is
// set when the bytes up to the end of s are the beginning of a valid sequence.
int Utf8SequenceAt(std::string_view s, size_t p, bool* truncated) {
  *truncated = false;
  const uint8_t b = static_cast<uint8_t>(s[p]);
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) len = 2;
  if (b >= 0xE0 && b <= 0xEF) len = 3;
  if (b >= 0xF0 && b <= 0xF4) len = 4;
  if (len == 0) return 0;
  if (b == 0xE0) lo = 0xA0;
  if (b == 0xED) hi = 0x9F;
  if (b == 0xF0) lo = 0x90;
  if (b == 0xF4) hi = 0x8F;
  for (int i = 1; i < len; ++i) {
    if (p + i >= s.size()) {
      *truncated = true;
      return 0;
    }
    const uint8_t c = static_cast<uint8_t>(s[p + i]);
    if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return 0;
  }
  return len;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

std::string LenientUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t p = 0; p < bytes.size();) {
    bool truncated = false;
    const int len = Utf8SequenceAt(bytes, p, &truncated);
    if (len == 0) {
      out += kReplacement;
      ++p;
    } else {
      out.append(bytes.substr(p, len));
      p += len;
    }
  }
  return out;
}

CompletionText::CompletionText(std::vector<std::string> stop) : stop_(std::move(stop)) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

std::string CompletionText::Append(std::string_view bytes) {
  if (stopped_) return "";
  raw_.append(bytes);
  size_t match = std::string::npos;
  for (const std::string& s : stop_) match = std::min(match, raw_.find(s, released_));
  if (match != std::string::npos) {
    stopped_ = true;
    raw_.resize(match);
    return Finish();
  }
  return Release(raw_.size() - StopHoldBack());
}

std::string CompletionText::Finish() {
  std::string out = LenientUtf8(std::string_view(raw_).substr(released_));
  released_ = raw_.size();
  text_ += out;
  return out;
}

// Releases raw_[released_, end) as far as complete sequences go.
std::string CompletionText::Release(size_t end) {
  std::string out;
  size_t p = released_;
  while (p < end) {
    bool truncated = false;
    const int len = Utf8SequenceAt(raw_, p, &truncated);
    if (truncated || p + std::max(len, 1) > end) break;
    if (len == 0) {
      out += kReplacement;
      ++p;
    } else {
      out.append(raw_, p, len);
      p += len;
    }
  }
  released_ = p;
  text_ += out;
  return out;
}

// The longest unreleased suffix of raw_ that begins some stop string.
size_t CompletionText::StopHoldBack() const {
  const std::string_view pending = std::string_view(raw_).substr(released_);
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t k = std::min(s.size() - 1, pending.size()); k > hold; --k) {
      if (pending.substr(pending.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

}  // namespace baton
