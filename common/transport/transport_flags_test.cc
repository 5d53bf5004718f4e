#include "common/transport/transport_flags.h"

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, ucx_tls);
ABSL_DECLARE_FLAG(std::string, step_channel_ucx_tls);
ABSL_DECLARE_FLAG(strata::transport::ErrorMode, transport_error_mode);

namespace strata::transport {
namespace {

TEST(TransportFlags, SharedMemoryTransportsAreNamedInAnyPlaceOfTheList) {
  EXPECT_TRUE(UcxTlsNamesSharedMemory("sm"));
  EXPECT_TRUE(UcxTlsNamesSharedMemory("sm,self,tcp"));
  EXPECT_TRUE(UcxTlsNamesSharedMemory("tcp,posix"));
  EXPECT_TRUE(UcxTlsNamesSharedMemory("sysv"));
  EXPECT_FALSE(UcxTlsNamesSharedMemory("tcp"));
  EXPECT_FALSE(UcxTlsNamesSharedMemory("rc,ud,self"));
  EXPECT_FALSE(UcxTlsNamesSharedMemory(""));
  EXPECT_FALSE(UcxTlsNamesSharedMemory("smx,tcp"));
}

// The step channel takes its own transports, and the error mode they need: UCX's own
// dead-peer detection where it has one, none over shared memory (where the liveness
// sockets find dead peers), whatever the data plane's flags say.
TEST(TransportFlags, TheStepChannelsErrorModeFollowsItsTransports) {
  absl::SetFlag(&FLAGS_ucx_tls, "sm,self,tcp");
  absl::SetFlag(&FLAGS_transport_error_mode, ErrorMode::kNone);
  absl::SetFlag(&FLAGS_step_channel_ucx_tls, "tcp");
  TransportConfig c = StepChannelConfigFromFlags();
  EXPECT_EQ(c.ucx_options.at("TLS"), "tcp");
  EXPECT_EQ(c.error_mode, ErrorMode::kPeer);
  EXPECT_EQ(TransportConfigFromFlags().error_mode, ErrorMode::kNone);

  absl::SetFlag(&FLAGS_ucx_tls, "tcp");
  absl::SetFlag(&FLAGS_transport_error_mode, ErrorMode::kPeer);
  absl::SetFlag(&FLAGS_step_channel_ucx_tls, "sm,self");
  c = StepChannelConfigFromFlags();
  EXPECT_EQ(c.ucx_options.at("TLS"), "sm,self");
  EXPECT_EQ(c.error_mode, ErrorMode::kNone);

  // Empty: the data plane's transports, and their error mode.
  absl::SetFlag(&FLAGS_ucx_tls, "sm,self,tcp");
  absl::SetFlag(&FLAGS_step_channel_ucx_tls, "");
  EXPECT_EQ(StepChannelConfigFromFlags().error_mode, ErrorMode::kNone);
  absl::SetFlag(&FLAGS_ucx_tls, "tcp");
  EXPECT_EQ(StepChannelConfigFromFlags().error_mode, ErrorMode::kPeer);
}

}  // namespace
}  // namespace strata::transport
