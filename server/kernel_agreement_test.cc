// Which nodes a deployment admits (kernel_agreement.h): alike nodes join; a different kernel
// path, or different results of the kernels a node runs, is refused with the node it
// disagrees with named; only live nodes count.
#include "server/kernel_agreement.h"

#include "gtest/gtest.h"

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

// The nodes alive, admitting each as the control plane does.
class Deployment {
 public:
  absl::Status Register(const control::NodeInfo& info, bool allow_mixed = false) {
    std::vector<const control::NodeInfo*> live;
    for (const control::NodeInfo& n : nodes_) live.push_back(&n);
    absl::Status s = CheckKernelAgreement(info, live, allow_mixed);
    if (s.ok()) nodes_.push_back(info);
    return s;
  }
  void Die(const std::string& name) {
    for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
      if (it->name() == name) {
        nodes_.erase(it);
        return;
      }
    }
  }

 private:
  std::vector<control::NodeInfo> nodes_;
};

TEST(KernelAgreement, AlikeNodesJoin) {
  Deployment d;
  EXPECT_TRUE(d.Register(Node("memory-0", kMemory, "avx512", "aa")).ok());
  EXPECT_TRUE(d.Register(Node("compute-0", kCompute, "avx512", "aa", "kk")).ok());
  EXPECT_TRUE(d.Register(Node("compute-1", kCompute, "avx512", "aa", "kk")).ok());
  EXPECT_TRUE(d.Register(Node("memory-1", kMemory, "avx512", "aa")).ok());
}

TEST(KernelAgreement, AnotherKernelPathIsRefusedNamingBothNodes) {
  Deployment d;
  ASSERT_TRUE(d.Register(Node("compute-0", kCompute, "avx512", "aa", "kk")).ok());
  const absl::Status s = d.Register(Node("memory-0", kMemory, "avx2", "aa"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("memory-0 runs avx2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("compute-0 runs avx512"), std::string::npos) << s;
}

TEST(KernelAgreement, OtherAttentionResultsAreRefusedWhateverTheRole) {
  Deployment d;
  ASSERT_TRUE(d.Register(Node("memory-0", kMemory, "avx512", "aa")).ok());
  for (const control::NodeRole role : {kMemory, kCompute}) {
    const absl::Status s = d.Register(Node("node-x", role, "avx512", "ab", "kk"));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("node-x's attention kernels"), std::string::npos) << s;
    EXPECT_NE(s.message().find("memory-0's (aa)"), std::string::npos) << s;
  }
}

TEST(KernelAgreement, OnlyComputeNodesMustAgreeOnEveryKernel) {
  Deployment d;
  ASSERT_TRUE(d.Register(Node("compute-0", kCompute, "avx512", "aa", "kk")).ok());
  // A memory node runs attention alone: what else it would compute is not compared.
  EXPECT_TRUE(d.Register(Node("memory-0", kMemory, "avx512", "aa", "other")).ok());
  const absl::Status s = d.Register(Node("compute-1", kCompute, "avx512", "aa", "kx"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("compute-1's kernels"), std::string::npos) << s;
  EXPECT_NE(s.message().find("compute-0's (kk)"), std::string::npos) << s;
}

TEST(KernelAgreement, OnlyLiveNodesCount) {
  Deployment d;
  ASSERT_TRUE(d.Register(Node("memory-0", kMemory, "avx512", "aa")).ok());
  ASSERT_TRUE(d.Register(Node("compute-0", kCompute, "avx512", "aa", "kk")).ok());
  // Another build's compute node is refused while the old one runs...
  EXPECT_FALSE(d.Register(Node("compute-1", kCompute, "avx512", "aa", "k2")).ok());
  // ...and admitted once it is gone: then the deployment runs the new build's kernels.
  d.Die("compute-0");
  EXPECT_TRUE(d.Register(Node("compute-1", kCompute, "avx512", "aa", "k2")).ok());
  EXPECT_FALSE(d.Register(Node("compute-0", kCompute, "avx512", "aa", "kk")).ok());
  // Likewise for attention, once every node of the old build is gone.
  EXPECT_FALSE(d.Register(Node("memory-1", kMemory, "avx512", "ab")).ok());
  d.Die("memory-0");
  d.Die("compute-1");
  EXPECT_TRUE(d.Register(Node("memory-1", kMemory, "avx512", "ab")).ok());
}

TEST(KernelAgreement, NodesThatReportNoFingerprintAreNotCompared) {
  Deployment d;
  ASSERT_TRUE(d.Register(Node("memory-0", kMemory, "avx512", "")).ok());
  EXPECT_TRUE(d.Register(Node("memory-1", kMemory, "avx512", "aa")).ok());
  EXPECT_TRUE(d.Register(Node("memory-2", kMemory, "avx512", "")).ok());
  EXPECT_FALSE(d.Register(Node("memory-3", kMemory, "avx512", "ab")).ok());
}

TEST(KernelAgreement, MixedNodesAreAdmittedWhenAllowed) {
  Deployment d;
  EXPECT_TRUE(d.Register(Node("compute-0", kCompute, "avx512", "aa", "kk"), true).ok());
  EXPECT_TRUE(d.Register(Node("memory-0", kMemory, "avx2", "ab"), true).ok());
  EXPECT_TRUE(d.Register(Node("compute-1", kCompute, "avx512", "aa", "kx"), true).ok());
}

}  // namespace
}  // namespace strata
