// What one machine can check of the fingerprints' promise (fingerprint.h): they do not
// depend on the thread count, and the GEMM's, whose every path sums in one order, are the
// same on every ISA path. Two machines are compared by running isa_fingerprint on both.
#include "kernels/cpu/fingerprint.h"

#include <omp.h>

#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"

namespace strata::kernels {
namespace {

class FingerprintTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ForceCpuIsa(saved_isa_);
    omp_set_num_threads(saved_threads_);
  }
  const CpuIsa saved_isa_ = ActiveCpuIsa();
  const int saved_threads_ = omp_get_max_threads();
};

TEST_F(FingerprintTest, TheThreadCountDoesNotChangeThem) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (!ForceCpuIsa(isa)) continue;
    omp_set_num_threads(1);
    const std::vector<KernelFingerprint> one = KernelFingerprints();
    ASSERT_GT(one.size(), 10u);
    for (int threads : {2, 3, 5}) {
      omp_set_num_threads(threads);
      const std::vector<KernelFingerprint> many = KernelFingerprints();
      ASSERT_EQ(many.size(), one.size());
      for (size_t i = 0; i < one.size(); ++i) {
        EXPECT_EQ(many[i].kernel, one[i].kernel);
        EXPECT_EQ(many[i].hash, one[i].hash)
            << one[i].kernel << " on " << CpuIsaName(isa) << " at " << threads << " threads";
      }
    }
  }
}

TEST_F(FingerprintTest, TheGemmsAreTheSameOnEveryPath) {
  ASSERT_TRUE(ForceCpuIsa(CpuIsa::kScalar));
  const std::vector<KernelFingerprint> scalar = KernelFingerprints();
  int compared = 0;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (!ForceCpuIsa(isa)) continue;
    const std::vector<KernelFingerprint> vector_path = KernelFingerprints();
    ASSERT_EQ(vector_path.size(), scalar.size());
    for (size_t i = 0; i < scalar.size(); ++i) {
      if (scalar[i].kernel.rfind("gemm", 0) != 0) continue;
      EXPECT_EQ(vector_path[i].hash, scalar[i].hash)
          << scalar[i].kernel << " on " << CpuIsaName(isa);
      ++compared;
    }
  }
  if (compared == 0) GTEST_SKIP() << "this CPU has no vector path";
}

// What nodes report at registration tells paths apart: scalar attention and the best
// vector path here round differently, so their attention fingerprints differ.
TEST_F(FingerprintTest, AttentionFingerprintsTellPathsApart) {
  ASSERT_TRUE(ForceCpuIsa(CpuIsa::kScalar));
  const std::string scalar = CombinedFingerprint(KernelFingerprints(), "attention");
  ForceCpuIsa(saved_isa_);
  if (saved_isa_ == CpuIsa::kScalar) GTEST_SKIP() << "this CPU has no vector path";
  const std::string vector_path = CombinedFingerprint(KernelFingerprints(), "attention");
  EXPECT_NE(vector_path, scalar);
  EXPECT_EQ(vector_path.size(), 16u);
  EXPECT_EQ(CombinedFingerprint(KernelFingerprints(), "attention"), vector_path);
}

TEST_F(FingerprintTest, OneChangedByteChangesTheHash) {
  unsigned char bytes[64] = {};
  const uint64_t zero = FingerprintBytes(bytes, sizeof(bytes));
  for (size_t i = 0; i < sizeof(bytes); ++i) {
    bytes[i] = 1;
    EXPECT_NE(FingerprintBytes(bytes, sizeof(bytes)), zero) << "byte " << i;
    bytes[i] = 0;
  }
}

}  // namespace
}  // namespace strata::kernels
