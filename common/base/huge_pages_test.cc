#include "common/base/huge_pages.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
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

// An arena's arrays follow one another, 64-byte aligned, in advised chunks of whole huge
// pages; an array larger than a chunk gets one of its own, and the next starts a new one.
TEST(HugePagesTest, AnArenaPlacesArraysOneAfterAnotherInAdvisedChunks) {
  StreamingArena arena(kHugePageBytes);  // chunks of one huge page
  auto* a = static_cast<char*>(arena.Allocate(1000));
  auto* b = static_cast<char*>(arena.Allocate(100));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kHugePageBytes, 0u);
  EXPECT_EQ(b, a + 1024);  // 1000 rounded up to 64 bytes
  EXPECT_EQ(arena.chunks(), 1u);
  auto* big = static_cast<char*>(arena.Allocate(3 * kHugePageBytes + 5));
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % kHugePageBytes, 0u);
  EXPECT_EQ(arena.chunks(), 2u);
  auto* after = static_cast<char*>(arena.Allocate(kHugePageBytes / 2));
  EXPECT_EQ(after, big + 3 * kHugePageBytes + 64);  // the big chunk's last huge page
  EXPECT_EQ(arena.chunks(), 2u);
  std::memset(a, 1, 1000);
  std::memset(b, 2, 100);
  std::memset(big, 3, 3 * kHugePageBytes + 5);
  EXPECT_EQ(a[999], 1);
  EXPECT_EQ(b[0], 2);
  const std::string setting = ThpSetting();
  if (setting == "madvise" || setting == "always") {
    EXPECT_EQ(ThpEligible(a), 1) << "THP setting " << setting;
    EXPECT_EQ(ThpEligible(big + 3 * kHugePageBytes), 1) << "THP setting " << setting;
  }
  auto* next = static_cast<char*>(arena.Allocate(kHugePageBytes));
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(arena.chunks(), 3u);  // what was left of the big one's last page was too small
}

}  // namespace
}  // namespace strata
