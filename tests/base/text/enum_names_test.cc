// EnumNames: each value's name from the one table, names parsed back, and an error that lists
// every name.
#include "base/text/enum_names.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

enum class Color { kRed, kGreen, kBlue, kUnnamed };

constexpr EnumNames<Color, 3> kColors{
    "color", {{{Color::kRed, "red"}, {Color::kGreen, "green"}, {Color::kBlue, "blue"}}}};

TEST(EnumNames, NamesAndParsesBack) {
  static_assert(std::string_view(kColors.Name(Color::kGreen)) == "green");
  for (const auto& e : kColors.entries) {
    Result<Color> back = kColors.Parse(kColors.Name(e.value));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, e.value);
  }
  EXPECT_STREQ(kColors.Name(Color::kUnnamed), "unknown");
}

TEST(EnumNames, AnUnknownNameIsRefusedWithEveryName) {
  Result<Color> bad = kColors.Parse("Red");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "unknown color 'Red' (red, green or blue)");
  constexpr EnumNames<Color, 1> kOne{"color", {{{Color::kRed, "red"}}}};
  EXPECT_EQ(kOne.Parse("").status().message(), "unknown color '' (red)");
}

}  // namespace
}  // namespace baton
