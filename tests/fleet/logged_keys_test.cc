#include "fleet/logged_keys.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(LoggedKeys, AKeyIsLoggedOncePerVersionAndForgottenOnceNotRefused) {
  LoggedKeys logged;
  EXPECT_TRUE(logged.First("/n/a", 5));
  EXPECT_TRUE(logged.First("/n/b", 7));
  logged.EndReading();
  EXPECT_FALSE(logged.First("/n/a", 5)) << "the same version again";
  EXPECT_TRUE(logged.First("/n/b", 8)) << "a new version of a bad key";
  logged.EndReading();
  EXPECT_FALSE(logged.First("/n/b", 8));
  logged.EndReading();  // /n/a not refused in this reading: forgotten
  EXPECT_TRUE(logged.First("/n/a", 5));
}

}  // namespace
}  // namespace baton
