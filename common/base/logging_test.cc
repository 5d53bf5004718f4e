#include "common/base/logging.h"

#include "absl/status/statusor.h"
#include "common/base/status_macros.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckQuarter(int x) {
  RETURN_IF_ERROR(Quarter(x).status());
  return absl::OkStatus();
}

TEST(StatusMacros, PropagateErrorsAndValues) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().message(), "odd");
  EXPECT_TRUE(CheckQuarter(4).ok());
  EXPECT_EQ(CheckQuarter(2).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Logging, CheckFailureAborts) {
  EXPECT_DEATH({ CHECK_EQ(1 + 1, 3) << "arithmetic"; },
               "Check failed: 1 \\+ 1 == 3 \\(2 vs 3\\) arithmetic");
  EXPECT_DEATH({ LOG(FATAL) << "fatal line"; }, "fatal line");
}

TEST(Logging, SeverityThresholdFilters) {
  SetMinLogSeverity(LogSeverity::kError);
  int evaluated = 0;
  LOG(INFO) << (++evaluated);
  EXPECT_EQ(evaluated, 0) << "a filtered line must not evaluate its operands";
  LOG(ERROR) << (++evaluated);
  EXPECT_EQ(evaluated, 1);
  SetMinLogSeverity(LogSeverity::kInfo);
}

TEST(Logging, FirstNLogsOnlyNTimes) {
  int evaluated = 0;
  for (int i = 0; i < 10; ++i) {
    LOG_FIRST_N(INFO, 3) << "line " << (++evaluated);
  }
  EXPECT_EQ(evaluated, 3);
}

}  // namespace
}  // namespace strata
