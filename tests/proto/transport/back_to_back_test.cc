// MapBackToBack: two memfds mapped as one range, so that an offset means the same byte to
// every process that maps them this way (a partial weight arena: huge pages, then 4 KiB).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

#include "proto/transport/shared_memory.h"

namespace baton {
namespace {

SharedMemory Plain(size_t size) {
  auto shm = SharedMemory::Create({.name = "back-to-back", .size = size, .try_huge_pages = false});
  EXPECT_TRUE(shm.ok()) << shm.status().ToString();
  return std::move(shm).value();
}

uint8_t ByteAt(size_t i) { return static_cast<uint8_t>(i * 131 + i / 4096); }

TEST(MapBackToBackTest, OffsetsRunOnFromTheFirstMemfdIntoTheSecond) {
  SharedMemory first = Plain(kHugePageSize);
  SharedMemory second = Plain(3 * 4096);
  auto writer = MapBackToBack(first, second, Protection::kReadWrite);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  ASSERT_EQ(writer->size(), kHugePageSize + 3 * 4096);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(writer->data()) % kHugePageSize, 0u);
  for (size_t i = 0; i < writer->size(); ++i) writer->data()[i] = ByteAt(i);

  // Each memfd holds its own part: the second's first byte is the range's byte 2 MiB.
  auto tail = second.Map(Protection::kReadOnly);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->data()[0], ByteAt(kHugePageSize));
  EXPECT_EQ(tail->data()[tail->size() - 1], ByteAt(writer->size() - 1));

  // A second mapper (as an engine maps what it was sent) sees the same bytes at every offset.
  auto reader = MapBackToBack(first, second, Protection::kReadOnly);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(std::memcmp(reader->data(), writer->data(), writer->size()), 0);
}

TEST(MapBackToBackTest, AnEmptySecondMapsTheFirstAlone) {
  SharedMemory first = Plain(8192);
  auto m = MapBackToBack(first, SharedMemory(), Protection::kReadWrite);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->size(), 8192u);
}

TEST(MapBackToBackTest, ReadOnlySealsRefuseAWritableMappingOfEitherPart) {
  SharedMemory first = Plain(kHugePageSize);
  SharedMemory second = Plain(4096);
  ASSERT_TRUE(second.Seal(Sealing::kReadOnly).ok());
  auto writable = MapBackToBack(first, second, Protection::kReadWrite);
  ASSERT_FALSE(writable.ok());
  EXPECT_NE(writable.status().message().find("part 2"), std::string::npos)
      << writable.status().ToString();
  EXPECT_TRUE(MapBackToBack(first, second, Protection::kReadOnly).ok());
}

}  // namespace
}  // namespace baton
