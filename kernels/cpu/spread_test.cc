#include "kernels/cpu/spread.h"

#include <algorithm>
#include <cstdint>
#include <vector>

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

// Every line of every run comes once, in order (runs as added, lines ascending), spread
// as Spread spaces them, and calls past `steps` request nothing. A run whose length is not
// whole lines takes its part line too, and one that starts part of the way into a line
// takes the lines it reaches from there (two heads of 80 after an odd number of them: 320
// bytes from 32 bytes in hold 6 lines, not 5).
TEST(SpreadLinesTest, RequestsEveryLineOnceInOrderOverTheSteps) {
  alignas(64) static char memory[64 * 64];
  for (int steps : {1, 3, 8, 40}) {
    SpreadLines lines;
    lines.Add(memory + 64 * 10, 3 * 64);
    lines.Add(memory, 0);  // nothing
    lines.Add(memory + 64 * 40, 64);
    lines.Add(memory, 2 * 64);
    lines.Add(memory + 64 * 50 + 32, 160);  // lines 50 to 52
    lines.Add(memory + 64 * 20 + 32, 320);  // lines 20 to 25
    lines.Add(memory + 64 * 30 + 8, 8);     // line 30
    lines.Begin(steps);
    std::vector<const char*> got;
    for (int i = 1; i <= steps + 2; ++i) {
      lines.Request([&](const char* line) { got.push_back(line); });
      ASSERT_EQ(static_cast<int64_t>(got.size()), std::min(i, steps) * 16 / steps)
          << "steps " << steps;
    }
    std::vector<const char*> want = {memory + 640,  memory + 704, memory + 768,
                                     memory + 2560, memory,       memory + 64};
    for (int line : {50, 51, 52, 20, 21, 22, 23, 24, 25, 30}) want.push_back(memory + 64 * line);
    EXPECT_EQ(got, want) << "steps " << steps;
  }
}

}  // namespace
}  // namespace strata::kernels
