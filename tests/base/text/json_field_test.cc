#include "base/text/json_field.h"

#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace baton {
namespace {

using nlohmann::json;

TEST(JsonField, ReadsTheTypedField) {
  const json j = json::parse(R"({"pid": 4242, "name": "e1", "bytes": 18446744073709551615})");
  pid_t pid = 0;
  std::string name;
  uint64_t bytes = 0;
  ASSERT_TRUE(JsonField(j, "pid", "roster", &pid).ok());
  ASSERT_TRUE(JsonField(j, "name", "roster", &name).ok());
  ASSERT_TRUE(JsonField(j, "bytes", "roster", &bytes).ok());
  EXPECT_EQ(pid, 4242);
  EXPECT_EQ(name, "e1");
  EXPECT_EQ(bytes, UINT64_MAX);
}

TEST(JsonField, AMissingOrMistypedFieldIsRefusedByName) {
  const json j = json::parse(R"({"pid": "4242"})");
  pid_t pid = 0;
  Status missing = JsonField(j, "port", "roster entry 3", &pid);
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("roster entry 3: 'port' is missing"), std::string::npos);
  EXPECT_EQ(JsonField(j, "pid", "roster", &pid).code(), StatusCode::kInvalidArgument);
}

// A wide number would wrap into another value (a pid of 2^32 + 4242 read as 4242: another
// process); a fraction would be cut.
TEST(JsonField, AnIntegerTheTypeCannotHoldIsRefusedNotWrapped) {
  const json j = json::parse(
      R"({"pid": 4294971538, "neg": -1, "half": 2.5, "big": 18446744073709551615, "t": true})");
  pid_t pid = 7;
  uint32_t u = 7;
  int64_t wide = 7;
  Status wrapped = JsonField(j, "pid", "roster", &pid);
  EXPECT_EQ(wrapped.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrapped.message().find("'pid' is not an integer in range: 4294971538"),
            std::string::npos)
      << wrapped.ToString();
  EXPECT_EQ(JsonField(j, "neg", "r", &u).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(JsonField(j, "half", "r", &pid).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(JsonField(j, "big", "r", &wide).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(JsonField(j, "t", "r", &pid).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pid, 7);
  EXPECT_EQ(u, 7u);
  EXPECT_EQ(wide, 7);
  EXPECT_TRUE(JsonField(j, "neg", "r", &wide).ok());
  EXPECT_EQ(wide, -1);
}

TEST(JsonIntegerFits, HoldsExactlyTheTypesRange) {
  EXPECT_TRUE(JsonIntegerFits<uint8_t>(json(255)));
  EXPECT_FALSE(JsonIntegerFits<uint8_t>(json(256)));
  EXPECT_TRUE(JsonIntegerFits<int32_t>(json(INT32_MIN)));
  EXPECT_FALSE(JsonIntegerFits<int32_t>(json(int64_t{INT32_MIN} - 1)));
  EXPECT_FALSE(JsonIntegerFits<uint64_t>(json(-1)));
  EXPECT_FALSE(JsonIntegerFits<int>(json(1.0)));
  EXPECT_FALSE(JsonIntegerFits<int>(json("1")));
}

}  // namespace
}  // namespace baton
