#include "base/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>

namespace baton {
namespace {

Status FailIf(bool fail) { return fail ? InvalidArgument("bad thing") : OkStatus(); }

Status Chain(bool fail) {
  BATON_RETURN_IF_ERROR(FailIf(fail));
  return OkStatus();
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  BATON_ASSIGN_OR_RETURN(int h, Half(x));
  BATON_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(OkStatus().ok());
  Status s = InvalidArgument("x");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: x");
  EXPECT_EQ(s.WithContext("file.bin").message(), "file.bin: x");
  EXPECT_EQ(OkStatus().ToString(), "OK");
}

TEST(StatusTest, ReturnIfError) {
  EXPECT_TRUE(Chain(false).ok());
  EXPECT_EQ(Chain(true).message(), "bad thing");
}

TEST(StatusTest, AssignOrReturn) {
  ASSERT_TRUE(Quarter(8).ok());
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().message(), "odd: 3");
  EXPECT_EQ(Quarter(5).status().message(), "odd: 5");
}

TEST(StatusTest, ResultFromOkStatusIsInternalError) {
  Result<int> r(OkStatus());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(StatusTest, ResultHoldsMoveOnly) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(7));
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

TEST(StatusTest, ErrnoStatusNamesTheCallAndError) {
  Status s = ErrnoStatus("open(/nope)", ENOENT);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("open(/nope)"), std::string::npos);
  EXPECT_NE(s.message().find("No such file"), std::string::npos);
}

}  // namespace
}  // namespace baton
