// A binary has the transport backends it links and no other: this test links only the
// in-process backend, so Transport::Create makes an in-process transport and refuses UCX
// with an error that names the backend.
#include "absl/status/status.h"
#include "common/transport/transport.h"
#include "gtest/gtest.h"

namespace strata::transport {
namespace {

TEST(BackendLink, OnlyLinkedBackendsCanBeCreated) {
  TransportConfig inproc;
  inproc.backend = Backend::kInproc;
  auto t = Transport::Create(inproc);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->capabilities().backend, "inproc");

  TransportConfig ucx;
  ucx.backend = Backend::kUcx;
  auto refused = Transport::Create(ucx);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("'ucx' is not linked"), std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace strata::transport
