// FrameSeal: a connection's frames open at its other end, in order, and only there; a frame
// replayed, reordered, altered, relabelled, taken from another connection or sealed under
// another deployment's key does not open, while a frame lost before its seal was checked
// costs only itself.
#include "common/protocol/step_frame.h"

#include <sys/mman.h>

#include <string>
#include <vector>

#include "common/base/crypto.h"
#include "gtest/gtest.h"
#include "proto/control.pb.h"

namespace strata {
namespace {

using transport::FrameKind;

const std::string kKey(32, 'k');

std::span<const uint8_t> Span(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string SealOrDie(FrameSeal& seal, FrameKind kind, uint64_t step, const std::string& text) {
  absl::StatusOr<std::string> sealed = seal.Seal(kind, step, text);
  EXPECT_TRUE(sealed.ok()) << sealed.status();
  return sealed.value_or("");
}

// The two ends of one connection: the same transport secret.
struct Connection {
  std::string secret = SecureRandomBytes(32);
  FrameSeal scheduler{kKey, secret};
  FrameSeal node{kKey, secret};
};

TEST(FrameSealTest, BothDirectionsOpenInOrderAndHideWhatTheyCarry) {
  Connection c;
  ASSERT_TRUE(c.scheduler.enabled());
  // The node can answer before anything came (a refusal of a first frame that is bad).
  const std::string early = SealOrDie(c.node, FrameKind::kResult, 0, "refused");
  auto opened_early = c.scheduler.Open(FrameKind::kResult, 0, Span(early));
  ASSERT_TRUE(opened_early.ok()) << opened_early.status();
  EXPECT_EQ(*opened_early, "refused");
  for (uint64_t step = 1; step <= 5; ++step) {
    const std::string plan = "plan of step " + std::to_string(step);
    const std::string sealed = SealOrDie(c.scheduler, FrameKind::kPlan, step, plan);
    EXPECT_EQ(sealed.find("plan of step"), std::string::npos) << "the plan is in clear";
    EXPECT_EQ(sealed.size(), FrameSeal::kPrefixBytes + plan.size() + kAes256GcmTagBytes);
    auto opened = c.node.Open(FrameKind::kPlan, step, Span(sealed));
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(*opened, plan);
    const std::string result = "tokens of step " + std::to_string(step);
    auto back = c.scheduler.Open(FrameKind::kResult, step,
                                 Span(SealOrDie(c.node, FrameKind::kResult, step, result)));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, result);
  }
}

TEST(FrameSealTest, ReplayedAndReorderedFramesDoNotOpenButALostOneCostsOnlyItself) {
  Connection c;
  std::vector<std::string> frames;
  for (uint64_t step = 1; step <= 5; ++step) {
    frames.push_back(SealOrDie(c.scheduler, FrameKind::kPlan, step, "plan"));
  }
  ASSERT_TRUE(c.node.Open(FrameKind::kPlan, 1, Span(frames[0])).ok());
  EXPECT_FALSE(c.node.Open(FrameKind::kPlan, 1, Span(frames[0])).ok()) << "a replay opened";
  // Frame 2 never arrives whole (refused before its seal was looked at): 3 still opens.
  EXPECT_TRUE(c.node.Open(FrameKind::kPlan, 3, Span(frames[2])).ok());
  EXPECT_FALSE(c.node.Open(FrameKind::kPlan, 2, Span(frames[1])).ok()) << "a reordered one opened";
  EXPECT_TRUE(c.node.Open(FrameKind::kPlan, 4, Span(frames[3])).ok());
  EXPECT_TRUE(c.node.Open(FrameKind::kPlan, 5, Span(frames[4])).ok());
}

TEST(FrameSealTest, AlteredRelabelledForeignAndUnsealedFramesDoNotOpen) {
  Connection c;
  const std::string first = SealOrDie(c.scheduler, FrameKind::kPlan, 7, "plan seven");
  // Every byte of the sealed payload matters.
  for (size_t i = 0; i < first.size(); ++i) {
    std::string bent = first;
    bent[i] ^= 0x20;
    EXPECT_FALSE(FrameSeal(kKey, c.secret).Open(FrameKind::kPlan, 7, Span(bent)).ok())
        << "byte " << i;
  }
  // The header's step id and kind are covered too.
  EXPECT_FALSE(FrameSeal(kKey, c.secret).Open(FrameKind::kPlan, 8, Span(first)).ok());
  EXPECT_FALSE(FrameSeal(kKey, c.secret).Open(FrameKind::kResult, 7, Span(first)).ok());
  // Another deployment's secret, and another connection of this deployment.
  EXPECT_FALSE(
      FrameSeal(std::string(32, 'x'), c.secret).Open(FrameKind::kPlan, 7, Span(first)).ok());
  Connection other;
  const auto foreign = other.node.Open(FrameKind::kPlan, 7, Span(first));
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kPermissionDenied);
  // Not sealed at all.
  const auto plain = c.node.Open(FrameKind::kPlan, 7, Span("plan seven, in clear"));
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(plain.status().message().find("not sealed"), absl::string_view::npos);
  // None of that disturbed the connection.
  EXPECT_TRUE(c.node.Open(FrameKind::kPlan, 7, Span(first)).ok());
}

TEST(FrameSealTest, WithoutADeploymentKeyNothingIsSealedAndWithoutASecretNothingOpens) {
  EXPECT_FALSE(FrameSeal("", "secret").enabled());
  FrameSeal no_secret(kKey, "");
  EXPECT_TRUE(no_secret.enabled());
  EXPECT_EQ(no_secret.Seal(FrameKind::kPlan, 1, "x").status().code(),
            absl::StatusCode::kFailedPrecondition);
  Connection c;
  const std::string sealed = SealOrDie(c.scheduler, FrameKind::kPlan, 1, "x");
  EXPECT_FALSE(no_secret.Open(FrameKind::kPlan, 1, Span(sealed)).ok());
}

// A plan frame past kMaxStepFrameBytes is refused by its size, naming its step, before it
// is opened or parsed: one of 2 GiB or more, with a right checksum, used to reach protobuf
// with a negative size, which aborts the process (the compute node, or the server reading a
// result).
TEST(StepFrameTest, AnOversizedFrameIsRefusedNotFatal) {
  const size_t size = (size_t{1} << 31) + 16;
  void* mapped = mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  const std::span<const uint8_t> payload(static_cast<const uint8_t*>(mapped), size);
  transport::FrameHeader h;
  h.kind = static_cast<uint16_t>(FrameKind::kPlan);
  h.step_id = 7;
  h.payload_bytes = size;
  h.checksum = transport::PayloadChecksum(payload);
  control::StepPlan plan;
  uint64_t id = 0;
  const absl::Status status = ReadMessageFrame(transport::AsBytes(h), payload, absl::OkStatus(),
                                               FrameKind::kPlan, &plan, &id);
  munmap(mapped, size);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("at most"), std::string::npos) << status;
  EXPECT_EQ(id, 7u);
}

}  // namespace
}  // namespace strata
