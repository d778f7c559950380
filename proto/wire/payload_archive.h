// PayloadInputArchive: a cereal input archive that reads the portable-binary encoding of one
// message payload and never trusts a length prefix.
//
// Payloads are written with cereal::PortableBinaryOutputArchive (little-endian): a first byte
// 1 (little-endian) or 0 (big-endian), then the fields; strings and vectors are a u64 element
// count followed by the elements. cereal's own input archive resizes a container to whatever
// count the bytes claim, so a 30-byte payload could demand gigabytes. This archive reads the
// same encoding from a bounded buffer and refuses any count larger than the bytes left (every
// element of a Baton message field takes at least one byte), a bool other than 0 or 1, and an
// endianness byte other than 0 or 1. Errors are thrown as cereal::Exception; proto::Decode
// catches them. Thread-compatible.
#pragma once

#include <cereal/archives/portable_binary.hpp>
#include <cereal/cereal.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace baton::proto {

class PayloadInputArchive
    : public cereal::InputArchive<PayloadInputArchive, cereal::AllowEmptyClassElision> {
 public:
  explicit PayloadInputArchive(std::string_view bytes)
      : cereal::InputArchive<PayloadInputArchive, cereal::AllowEmptyClassElision>(this),
        bytes_(bytes) {
    uint8_t little_endian = 0;
    LoadBinary(&little_endian, 1, 1);
    if (little_endian > 1) {
      throw cereal::Exception("bad endianness byte " + std::to_string(little_endian));
    }
    swap_ = (little_endian == 1) != IsLittleEndianHost();
  }

  // Copies `size` bytes out of the payload, swapping each `elem_size`-byte element when the
  // payload's byte order differs from the host's.
  void LoadBinary(void* data, size_t size, size_t elem_size) {
    if (size > remaining()) {
      throw cereal::Exception("payload truncated: needed " + std::to_string(size) +
                              " more bytes at offset " + std::to_string(pos_) + ", " +
                              std::to_string(remaining()) + " left");
    }
    if (size > 0) std::memcpy(data, bytes_.data() + pos_, size);
    pos_ += size;
    if (swap_ && elem_size > 1) {
      auto* p = static_cast<uint8_t*>(data);
      for (size_t i = 0; i + elem_size <= size; i += elem_size) {
        for (size_t j = 0; j < elem_size / 2; ++j) std::swap(p[i + j], p[i + elem_size - 1 - j]);
      }
    }
  }

  size_t remaining() const { return bytes_.size() - pos_; }
  size_t position() const { return pos_; }

 private:
  static bool IsLittleEndianHost() {
    const uint16_t probe = 1;
    uint8_t first = 0;
    std::memcpy(&first, &probe, 1);
    return first == 1;
  }

  std::string_view bytes_;
  size_t pos_ = 0;
  bool swap_ = false;
};

template <class T>
std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_LOAD_FUNCTION_NAME(PayloadInputArchive& ar, T& t) {
  static_assert(!std::is_floating_point_v<T> || std::numeric_limits<T>::is_iec559,
                "portable binary needs IEEE 754 floating point");
  if constexpr (std::is_same_v<T, bool>) {
    uint8_t byte = 0;
    ar.LoadBinary(&byte, 1, 1);
    if (byte > 1) throw cereal::Exception("bad bool value " + std::to_string(byte));
    t = byte == 1;
  } else {
    ar.LoadBinary(&t, sizeof(T), sizeof(T));
  }
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(PayloadInputArchive& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(PayloadInputArchive& ar, cereal::SizeTag<T>& t) {
  uint64_t count = 0;
  ar.LoadBinary(&count, sizeof(count), sizeof(count));
  if (count > ar.remaining()) {
    throw cereal::Exception("length prefix " + std::to_string(count) + " at offset " +
                            std::to_string(ar.position() - sizeof(count)) + " exceeds the " +
                            std::to_string(ar.remaining()) + " bytes left in the payload");
  }
  t.size = static_cast<std::remove_reference_t<decltype(t.size)>>(count);
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(PayloadInputArchive& ar, cereal::BinaryData<T>& bd) {
  using Elem = std::remove_pointer_t<T>;
  static_assert(!std::is_floating_point_v<Elem> || std::numeric_limits<Elem>::is_iec559,
                "portable binary needs IEEE 754 floating point");
  ar.LoadBinary(bd.data, static_cast<size_t>(bd.size), sizeof(Elem));
}

}  // namespace baton::proto

CEREAL_REGISTER_ARCHIVE(baton::proto::PayloadInputArchive)

namespace cereal::traits::detail {
template <>
struct get_output_from_input<baton::proto::PayloadInputArchive> {
  using type = cereal::PortableBinaryOutputArchive;
};
}  // namespace cereal::traits::detail
