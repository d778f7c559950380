// ByteTokenizer: the byte-level vocabulary of Baton's synthetic models: token id = byte
// value (0..255); ids from 256 up are special (bos, eos, pad, reserved) and carry no text.
//
// Encode maps each byte of the text to its id, optionally after the bos id. Decode writes
// the byte of each id below 256 and skips the rest, so a stream of decoded tokens joined is
// the decoded whole (a multi-byte UTF-8 character may span tokens). A plain value;
// thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "standby/model/llama_config.h"

namespace baton {

class ByteTokenizer {
 public:
  static constexpr int32_t kByteCount = 256;

  // Needs a vocabulary of at least 256 ids, and special ids (bos, eos) of 256 or more.
  static Result<ByteTokenizer> Create(const LlamaConfig& config);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  std::string Decode(std::span<const int32_t> ids) const;
  // The text of one token: one byte, or nothing for a special id.
  std::string DecodeToken(int32_t id) const;
  bool IsSpecial(int32_t id) const { return id < 0 || id >= kByteCount; }

  int vocab_size() const { return vocab_size_; }
  std::optional<int32_t> bos_token_id() const { return bos_; }
  const std::vector<int32_t>& eos_token_ids() const { return eos_; }

 private:
  int vocab_size_ = 0;
  std::optional<int32_t> bos_;
  std::vector<int32_t> eos_;
};

}  // namespace baton
