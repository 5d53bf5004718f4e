#include "common/base/huge_pages.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

// The kernel's THP setting, the bracketed word of /sys's file ("" if it cannot be read).
std::string ThpSetting() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t open = text.find('['), close = text.find(']');
  return open == std::string::npos || close == std::string::npos
             ? ""
             : text.substr(open + 1, close - open - 1);
}

// The THPeligible line of the mapping of this process that holds `p` (-1 if none says).
int ThpEligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

TEST(HugePagesTest, LargeArraysAreAlignedToAHugePageAndAdvised) {
  void* p = AllocateForStreaming(3 * kHugePageBytes + 100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  static_cast<char*>(p)[3 * kHugePageBytes + 99] = 1;
  const std::string setting = ThpSetting();
  if (setting == "madvise" || setting == "always") {
    // Under "madvise" only the advice makes the mapping eligible.
    EXPECT_EQ(ThpEligible(p), 1) << "THP setting " << setting;
  }
  std::free(p);
}

TEST(HugePagesTest, ArraysUnderAHugePageKeepTheOrdinaryAllocator) {
  void* p = AllocateForStreaming(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  // Not a huge page of memory for a thousand bytes: malloc's own heap, which is not 2
  // MiB-aligned for every such allocation.
  std::vector<void*> more;
  bool all_huge_aligned = reinterpret_cast<uintptr_t>(p) % kHugePageBytes == 0;
  for (int i = 0; i < 4; ++i) {
    more.push_back(AllocateForStreaming(1000));
    all_huge_aligned &= reinterpret_cast<uintptr_t>(more.back()) % kHugePageBytes == 0;
  }
  EXPECT_FALSE(all_huge_aligned);
  for (void* q : more) std::free(q);
  std::free(p);
}

TEST(HugePagesTest, AVectorKeepsItsValues) {
  std::vector<uint16_t, StreamingAllocator<uint16_t>> v(kHugePageBytes);  // 4 MiB
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i * 7);
  v.resize(v.size() + 3, 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePageBytes, 0u);
  for (size_t i = 0; i < kHugePageBytes; ++i) ASSERT_EQ(v[i], static_cast<uint16_t>(i * 7)) << i;
  EXPECT_EQ(v.back(), 5);
}

}  // namespace
}  // namespace strata
