#include "common/bench/read_probe.h"

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

// The sum of the 64-bit words of [at, at + bytes) in whole 32-byte pieces, one by one.
int64_t WordSum(const char* at, size_t bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i + 8 <= bytes / 32 * 32; i += 8) {
    uint64_t w;
    std::memcpy(&w, at + i, 8);
    sum += w;
  }
  return static_cast<int64_t>(sum);
}

// Every whole 32-byte piece of every run is read once, whatever the runs' lengths (a block
// of 256 bytes, a part block, a run under one piece, none), how many are read at once and
// how many threads share them; the last part piece of a run is not.
TEST(SumOfRunsTest, ReadsEveryWholePieceOfEveryRunOnce) {
  std::vector<char> memory(1 << 16);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<char>(i * 131 + 7);
  const std::vector<ReadRun> runs = {{memory.data() + 1000, 4096}, {memory.data() + 9, 700},
                                     {memory.data() + 20000, 31},  {memory.data() + 30000, 0},
                                     {memory.data() + 40000, 256}, {memory.data() + 50000, 1000},
                                     {memory.data() + 60000, 288}};
  int64_t want = 0, want_bytes = 0;
  for (const ReadRun& r : runs) {
    want += WordSum(static_cast<const char*>(r.at), r.bytes);
    want_bytes += static_cast<int64_t>(r.bytes / 32 * 32);
  }
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (int streams : {1, 2, 3, 4, 8}) {
      int64_t bytes = -1;
      EXPECT_EQ(SumOfRuns(runs, streams, &bytes), want)
          << threads << " threads, " << streams << " streams";
      EXPECT_EQ(bytes, want_bytes) << threads << " threads, " << streams << " streams";
    }
  }
}

}  // namespace
}  // namespace strata
