#include "standby/openai/completion_text.h"

#include <algorithm>
#include <cstdint>

#include "base/text/utf8.h"

namespace baton {
namespace {

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
  for (const std::string& s : stop_) {
    // A match ends in the new bytes: one within what was looked at before is none (text of a
    // token under min_tokens may hold a short stop string inside a longer one's start).
    const size_t ends_after = checked_ + 1 > s.size() ? checked_ + 1 - s.size() : 0;
    match = std::min(match, raw_.find(s, std::max(released_, ends_after)));
  }
  if (match != std::string::npos) {
    stopped_ = true;
    raw_.resize(match);
    return Finish();
  }
  checked_ = raw_.size();
  return Release(raw_.size() - StopHoldBack());
}

std::string CompletionText::AppendUnstoppable(std::string_view bytes) {
  if (stopped_) return "";
  raw_.append(bytes);
  checked_ = raw_.size();
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
