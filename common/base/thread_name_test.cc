#include "common/base/thread_name.h"

#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ThreadNameTest, NamesTheCallingThreadAndIsInherited) {
  std::string own, child, truncated;
  std::thread([&] {
    SetCurrentThreadName("exec-read");
    own = CurrentThreadName();
    std::thread([&] { child = CurrentThreadName(); }).join();
    SetCurrentThreadName("a-name-longer-than-fifteen");
    truncated = CurrentThreadName();
  }).join();
  EXPECT_EQ(own, "exec-read");
  EXPECT_EQ(child, "exec-read");
  EXPECT_EQ(truncated, "a-name-longer-t");
  EXPECT_NE(CurrentThreadName(), "exec-read");  // only that thread was named
}

}  // namespace
}  // namespace strata
