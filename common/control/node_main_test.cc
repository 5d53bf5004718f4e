// What a node tells the scheduler of itself (MakeNodeInfo): the versions it speaks, which
// the scheduler checks at registration (server/control_plane.cc), besides its name, role
// and kernel path. A data-plane version of 0 reads as "not reported" and is not checked, so
// a node that left it out would go unchecked.
#include "common/control/node_main.h"

#include "common/control/version.h"
#include "common/transport/handshake.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(MakeNodeInfoTest, ReportsTheVersionsThisBuildSpeaks) {
  const control::NodeInfo info = MakeNodeInfo(control::ROLE_MEMORY, "memory-0", "avx512");
  EXPECT_EQ(info.protocol_version(), kProtocolVersion);
  EXPECT_EQ(info.data_plane_version(), transport::kDataPlaneVersion);
  EXPECT_NE(info.data_plane_version(), 0u);
  EXPECT_EQ(info.build_version(), kBuildVersion);
  EXPECT_EQ(info.role(), control::ROLE_MEMORY);
  EXPECT_EQ(info.name(), "memory-0");
  EXPECT_EQ(info.cpu_isa(), "avx512");
}

}  // namespace
}  // namespace strata
