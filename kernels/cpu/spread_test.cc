#include "kernels/cpu/spread.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace strata::kernels {
namespace {

// Before step i the count made is floor(i * total / steps): every request is made, none
// early, and the gaps between them differ by at most one step.
TEST(SpreadTest, MakesEachRequestWhenItsShareOfTheStepsIsDone) {
  for (int64_t steps : {1, 2, 3, 7, 32, 100}) {
    for (int64_t total : {0, 1, 2, 5, 7, 31, 32, 33, 250}) {
      Spread spread(total, steps);
      int64_t made = 0;
      for (int64_t i = 1; i <= steps; ++i) {
        spread.Step([&] { ++made; });
        ASSERT_EQ(made, i * total / steps) << "total " << total << " steps " << steps;
      }
      EXPECT_EQ(made, total);
    }
  }
}

}  // namespace
}  // namespace strata::kernels
