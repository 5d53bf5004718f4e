#include "common/base/cpu_quota.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/cpu_affinity.h"
#include "common/base/cpu_quota_testing.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// A file system of cgroup files in a directory of the test's own.
class FakeCgroups : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            absl::StrCat("cgroups-", getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& path, const std::string& text) {
    const fs::path p = root_ / fs::path(path).relative_path();
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::optional<double> Limit(const std::string& mountinfo, const std::string& cgroup) {
    return CgroupCpuLimitFrom(mountinfo, cgroup, root_.string());
  }
  fs::path root_;
};

constexpr char kV2Mount[] =
    "25 1 0:22 / / rw,relatime - ext4 /dev/vda1 rw\n"
    "30 25 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

TEST_F(FakeCgroups, V2TheLowestQuotaOnThePathCounts) {
  Write("/sys/fs/cgroup/kubepods/cpu.max", "max 100000\n");
  Write("/sys/fs/cgroup/kubepods/pod1/cpu.max", "400000 100000\n");
  Write("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "250000 100000\n");
  EXPECT_EQ(Limit(kV2Mount, "0::/kubepods/pod1/ctr\n"), 2.5);
  // A parent's quota caps its children.
  Write("/sys/fs/cgroup/kubepods/pod1/cpu.max", "150000 100000\n");
  EXPECT_EQ(Limit(kV2Mount, "0::/kubepods/pod1/ctr\n"), 1.5);
  // The pod's own cgroup sees its own and its parents', not its child's.
  EXPECT_EQ(Limit(kV2Mount, "0::/kubepods/pod1\n"), 1.5);
  EXPECT_EQ(Limit(kV2Mount, "0::/kubepods\n"), std::nullopt);
}

TEST_F(FakeCgroups, V2WithoutAQuotaHasNoLimit) {
  Write("/sys/fs/cgroup/cpu.max", "max 100000\n");
  Write("/sys/fs/cgroup/a/cpu.max", "max 100000\n");
  EXPECT_EQ(Limit(kV2Mount, "0::/a\n"), std::nullopt);
  // No cpu.max at all (the cpu controller not enabled there).
  EXPECT_EQ(Limit(kV2Mount, "0::/b/c\n"), std::nullopt);
}

// Inside a container the runtime mounts the container's own cgroup at /sys/fs/cgroup: the
// mount's root is that cgroup, and its parents are not visible.
TEST_F(FakeCgroups, AContainersOwnCgroupMountedAtTheMountPoint) {
  const std::string mountinfo =
      "30 25 0:26 /kubepods/pod1/ctr /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n";
  Write("/sys/fs/cgroup/cpu.max", "200000 100000\n");
  EXPECT_EQ(Limit(mountinfo, "0::/kubepods/pod1/ctr\n"), 2.0);
  // With a cgroup namespace both say "/".
  EXPECT_EQ(Limit("30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/\n"), 2.0);
  // A cgroup outside the mount's root cannot be read here.
  EXPECT_EQ(Limit(mountinfo, "0::/kubepods/pod2/ctr\n"), std::nullopt);
  EXPECT_EQ(Limit(mountinfo, "0::/kubepods/pod1/ctr2\n"), std::nullopt);
  // Nor one outside the process's cgroup namespace.
  Write("/sys/cpu.max", "100000 100000\n");
  EXPECT_EQ(Limit("30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/../..\n"),
            std::nullopt);
}

// A hybrid host: the cpu controller on a v1 hierarchy (with cpuacct), v2 mounted empty.
TEST_F(FakeCgroups, V1CpuControllerBesideAnEmptyV2) {
  const std::string mountinfo = std::string(
      "31 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
      "32 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:7 - cgroup cgroup "
      "rw,cpu,cpuacct\n"
      "33 25 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  const std::string cgroup = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n";
  Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  // The memory hierarchy's files are not the cpu controller's.
  Write("/sys/fs/cgroup/memory/docker/abc/cpu.cfs_quota_us", "100000\n");
  Write("/sys/fs/cgroup/memory/docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(Limit(mountinfo, cgroup), 3.0);
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(Limit(mountinfo, cgroup), std::nullopt);
  // Both hierarchies hold a quota: the lower counts.
  Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n");
  Write("/sys/fs/cgroup/unified/docker/abc/cpu.max", "150000 100000\n");
  EXPECT_EQ(Limit(mountinfo, cgroup), 0.5);
}

TEST_F(FakeCgroups, EscapedMountPoints) {
  Write("/sys/fs/cgroup x/a/cpu.max", "100000 100000\n");
  EXPECT_EQ(Limit("30 25 0:26 / /sys/fs/cgroup\\040x rw - cgroup2 cgroup2 rw\n", "0::/a\n"), 1.0);
}

TEST_F(FakeCgroups, WhatDoesNotParseIsSkipped) {
  Write("/sys/fs/cgroup/a/cpu.max", "lots 100000\n");
  Write("/sys/fs/cgroup/b/cpu.max", "100000 0\n");
  Write("/sys/fs/cgroup/c/cpu.max", "100000\n");
  Write("/sys/fs/cgroup/d/cpu.max", "-5 100000\n");
  for (const char* cgroup : {"0::/a\n", "0::/b\n", "0::/c\n", "0::/d\n"}) {
    EXPECT_EQ(Limit(kV2Mount, cgroup), std::nullopt) << cgroup;
  }
  Write("/sys/fs/cgroup/e/cpu.max", "100000 100000\n");
  for (const char* mountinfo : {"", "garbage\n", "1 2 3 - cgroup2\n",
                                "30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"}) {
    EXPECT_EQ(Limit(mountinfo, "0::/e\n"), std::nullopt) << mountinfo;
  }
  for (const char* cgroup : {"", "0:/e\n", "0::e\n", "1:cpu:/e\n", "::\n"}) {
    EXPECT_EQ(Limit(kV2Mount, cgroup), std::nullopt) << cgroup;
  }
  // A good line among bad ones still counts.
  EXPECT_EQ(Limit(std::string("garbage\n") + kV2Mount, "junk\n0::/e\n"), 1.0);
}

// The real thing, where this process may make a cgroup with a quota of one core and move
// itself into it (cpu_quota_testing.h): CgroupCpuLimit reads it from /proc, and
// DefaultTeamSize follows it.
TEST(CgroupCpuLimitTest, FollowsARealQuota) {
  const std::optional<double> before = CgroupCpuLimit();
  testing::ScopedCpuQuota quota(1);
  if (!quota.ok()) GTEST_SKIP() << quota.why_not();
  const std::optional<double> limit = CgroupCpuLimit();
  const int team = DefaultTeamSize();
  quota.Leave();
  // (A quota the machine itself has, below one core, would stay the lowest.)
  EXPECT_EQ(limit, std::min(1.0, before.value_or(1.0)));
  EXPECT_EQ(team, 1) << AllowedCpus().size() << " cores allowed";
  EXPECT_EQ(CgroupCpuLimit(), before) << "after moving back";
}

}  // namespace
}  // namespace strata
