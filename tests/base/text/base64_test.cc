#include "base/text/base64.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    EXPECT_EQ(Base64Decode(encoded), std::optional<std::string>(plain));
  }
}

TEST(Base64, EveryByteRoundTrips) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  EXPECT_EQ(Base64Decode(Base64Encode(all)), all);
}

TEST(Base64, WhatIsNotCanonicalIsRefused) {
  for (const char* bad :
       {"Zg", "Zg=", "Z===", "Zm9v=", "Zh==", "Zm9=", "Zg==Zg==", "Zm 9v", "Zm9-"}) {
    EXPECT_FALSE(Base64Decode(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace baton
