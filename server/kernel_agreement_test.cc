// Which nodes a deployment admits (kernel_agreement.h): alike nodes join; a different kernel
// path, or different results of the kernels a node runs, is refused with both nodes named;
// a refused node leaves nothing behind.
#include "server/kernel_agreement.h"

#include "gtest/gtest.h"
#include "kernels/cpu/fingerprint.h"
#include "kernels/cpu/isa.h"

namespace strata {
namespace {

control::NodeInfo Node(const std::string& name, control::NodeRole role, const std::string& isa,
                       const std::string& attention, const std::string& kernels = "") {
  control::NodeInfo info;
  info.set_name(name);
  info.set_role(role);
  info.set_cpu_isa(isa);
  info.set_attention_fingerprint(attention);
  info.set_kernel_fingerprint(kernels);
  return info;
}

constexpr control::NodeRole kMemory = control::ROLE_MEMORY;
constexpr control::NodeRole kCompute = control::ROLE_COMPUTE;

TEST(KernelAgreement, AlikeNodesJoin) {
  KernelAgreement agreement(false);
  EXPECT_TRUE(agreement.Admit(Node("memory-0", kMemory, "avx512", "aa")).ok());
  EXPECT_TRUE(agreement.Admit(Node("compute-0", kCompute, "avx512", "aa", "kk")).ok());
  EXPECT_TRUE(agreement.Admit(Node("compute-1", kCompute, "avx512", "aa", "kk")).ok());
  EXPECT_TRUE(agreement.Admit(Node("memory-1", kMemory, "avx512", "aa")).ok());
}

TEST(KernelAgreement, AnotherKernelPathIsRefusedNamingBothNodes) {
  KernelAgreement agreement(false);
  ASSERT_TRUE(agreement.Admit(Node("compute-0", kCompute, "avx512", "aa", "kk")).ok());
  const absl::Status s = agreement.Admit(Node("memory-0", kMemory, "avx2", "aa"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("memory-0 runs avx2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("compute-0 runs avx512"), std::string::npos) << s;
}

TEST(KernelAgreement, OtherAttentionResultsAreRefusedWhateverTheRole) {
  KernelAgreement agreement(false);
  ASSERT_TRUE(agreement.Admit(Node("memory-0", kMemory, "avx512", "aa")).ok());
  for (const control::NodeRole role : {kMemory, kCompute}) {
    const absl::Status s = agreement.Admit(Node("node-x", role, "avx512", "ab", "kk"));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("node-x's attention kernels"), std::string::npos) << s;
    EXPECT_NE(s.message().find("memory-0's (aa)"), std::string::npos) << s;
  }
}

TEST(KernelAgreement, OnlyComputeNodesMustAgreeOnEveryKernel) {
  KernelAgreement agreement(false);
  ASSERT_TRUE(agreement.Admit(Node("compute-0", kCompute, "avx512", "aa", "kk")).ok());
  // A memory node runs attention alone: what else it would compute is not compared.
  EXPECT_TRUE(agreement.Admit(Node("memory-0", kMemory, "avx512", "aa", "other")).ok());
  const absl::Status s = agreement.Admit(Node("compute-1", kCompute, "avx512", "aa", "kx"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("compute-1's kernels"), std::string::npos) << s;
}

TEST(KernelAgreement, ARefusedNodeRecordsNothing) {
  KernelAgreement agreement(false);
  ASSERT_TRUE(agreement.Admit(Node("memory-0", kMemory, "avx512", "aa")).ok());
  // Refused for its attention: its other fingerprint must not become the deployment's.
  ASSERT_FALSE(agreement.Admit(Node("compute-0", kCompute, "avx512", "ab", "k1")).ok());
  EXPECT_TRUE(agreement.Admit(Node("compute-1", kCompute, "avx512", "aa", "k2")).ok());
  EXPECT_FALSE(agreement.Admit(Node("compute-2", kCompute, "avx512", "aa", "k1")).ok());
}

TEST(KernelAgreement, NodesThatReportNoFingerprintAreNotCompared) {
  KernelAgreement agreement(false);
  ASSERT_TRUE(agreement.Admit(Node("memory-0", kMemory, "avx512", "")).ok());
  EXPECT_TRUE(agreement.Admit(Node("memory-1", kMemory, "avx512", "aa")).ok());
  EXPECT_TRUE(agreement.Admit(Node("memory-2", kMemory, "avx512", "")).ok());
  EXPECT_FALSE(agreement.Admit(Node("memory-3", kMemory, "avx512", "ab")).ok());
}

TEST(KernelAgreement, MixedNodesAreAcceptedWhenAllowed) {
  KernelAgreement agreement(true);
  EXPECT_TRUE(agreement.Admit(Node("compute-0", kCompute, "avx512", "aa", "kk")).ok());
  EXPECT_TRUE(agreement.Admit(Node("memory-0", kMemory, "avx2", "ab")).ok());
  EXPECT_TRUE(agreement.Admit(Node("compute-1", kCompute, "avx512", "aa", "kx")).ok());
}

// What nodes report is a real discriminator: two kernel paths whose attention rounds
// differently (scalar and the best vector path here) give different fingerprints, and one
// path gives the same one each time.
TEST(KernelAgreement, RealFingerprintsTellPathsApart) {
  const kernels::CpuIsa saved = kernels::ActiveCpuIsa();
  ASSERT_TRUE(kernels::ForceCpuIsa(kernels::CpuIsa::kScalar));
  const std::string scalar =
      kernels::CombinedFingerprint(kernels::KernelFingerprints(), "attention");
  EXPECT_EQ(kernels::CombinedFingerprint(kernels::KernelFingerprints(), "attention"), scalar);
  kernels::ForceCpuIsa(saved);
  if (saved == kernels::CpuIsa::kScalar) GTEST_SKIP() << "this CPU has no vector path";
  const std::string vector_path =
      kernels::CombinedFingerprint(kernels::KernelFingerprints(), "attention");
  EXPECT_NE(vector_path, scalar);
  EXPECT_EQ(vector_path.size(), 16u);
}

}  // namespace
}  // namespace strata
