#include "standby/model/byte_tokenizer.h"

namespace baton {

Result<ByteTokenizer> ByteTokenizer::Create(const LlamaConfig& config) {
  if (config.vocab_size < kByteCount) {
    return InvalidArgument("byte tokenizer: vocab_size " + std::to_string(config.vocab_size) +
                           " is smaller than the 256 byte ids");
  }
  auto check = [](const char* what, int32_t id) -> Status {
    if (id >= kByteCount) return OkStatus();
    return InvalidArgument(std::string("byte tokenizer: ") + what + " " + std::to_string(id) +
                           " collides with a byte id (specials must be 256 or above)");
  };
  if (config.bos_token_id) BATON_RETURN_IF_ERROR(check("bos_token_id", *config.bos_token_id));
  for (int32_t id : config.eos_token_ids) BATON_RETURN_IF_ERROR(check("eos_token_id", id));
  ByteTokenizer t;
  t.vocab_size_ = config.vocab_size;
  t.bos_ = config.bos_token_id;
  t.eos_ = config.eos_token_ids;
  return t;
}

std::vector<int32_t> ByteTokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  if (add_bos && bos_) ids.push_back(*bos_);
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string ByteTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (!IsSpecial(id)) text.push_back(static_cast<char>(id));
  }
  return text;
}

std::string ByteTokenizer::DecodeToken(int32_t id) const {
  return IsSpecial(id) ? std::string() : std::string(1, static_cast<char>(id));
}

}  // namespace baton
