// FrameSeal: a connection's frames open on the other side in order and only there; a frame
// replayed, dropped, reordered, altered, relabelled, taken from another connection or
// sealed under another deployment's key does not open.
#include "common/protocol/step_frame.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

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

TEST(FrameSealTest, BothDirectionsOpenInOrderAndHideWhatTheyCarry) {
  auto scheduler = FrameSeal::Connecting(kKey);
  auto node = FrameSeal::Accepting(kKey);
  ASSERT_TRUE(scheduler->enabled());
  // The node cannot answer before it knows the connection's key.
  EXPECT_EQ(node->Seal(FrameKind::kResult, 1, "x").status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (uint64_t step = 1; step <= 5; ++step) {
    const std::string plan = "plan of step " + std::to_string(step);
    const std::string sealed = SealOrDie(*scheduler, FrameKind::kPlan, step, plan);
    EXPECT_EQ(sealed.find("plan of step"), std::string::npos) << "the plan is in clear";
    EXPECT_EQ(sealed.size(), FrameSeal::kPrefixBytes + plan.size() + 16);
    auto opened = node->Open(FrameKind::kPlan, step, Span(sealed));
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_EQ(*opened, plan);
    const std::string result = "tokens of step " + std::to_string(step);
    auto back = scheduler->Open(FrameKind::kResult, step,
                                Span(SealOrDie(*node, FrameKind::kResult, step, result)));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, result);
  }
}

TEST(FrameSealTest, ReplayedLostAndReorderedFramesDoNotOpen) {
  auto scheduler = FrameSeal::Connecting(kKey);
  auto node = FrameSeal::Accepting(kKey);
  std::vector<std::string> frames;
  for (uint64_t step = 1; step <= 4; ++step) {
    frames.push_back(SealOrDie(*scheduler, FrameKind::kPlan, step, "plan"));
  }
  // The second before the first: the node has not even learnt the connection yet.
  EXPECT_EQ(node->Open(FrameKind::kPlan, 2, Span(frames[1])).status().code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(node->Open(FrameKind::kPlan, 1, Span(frames[0])).ok());
  EXPECT_FALSE(node->Open(FrameKind::kPlan, 1, Span(frames[0])).ok()) << "a replay opened";
  EXPECT_FALSE(node->Open(FrameKind::kPlan, 3, Span(frames[2])).ok()) << "frame 2 was skipped";
  EXPECT_TRUE(node->Open(FrameKind::kPlan, 2, Span(frames[1])).ok());
  EXPECT_TRUE(node->Open(FrameKind::kPlan, 3, Span(frames[2])).ok());
}

TEST(FrameSealTest, AlteredRelabelledForeignAndUnsealedFramesDoNotOpen) {
  auto scheduler = FrameSeal::Connecting(kKey);
  const std::string first = SealOrDie(*scheduler, FrameKind::kPlan, 7, "plan seven");
  // Every byte of the sealed payload matters.
  for (size_t i = 0; i < first.size(); ++i) {
    std::string bent = first;
    bent[i] ^= 0x20;
    EXPECT_FALSE(FrameSeal::Accepting(kKey)->Open(FrameKind::kPlan, 7, Span(bent)).ok())
        << "byte " << i;
  }
  // The header's step id and kind are covered too.
  EXPECT_FALSE(FrameSeal::Accepting(kKey)->Open(FrameKind::kPlan, 8, Span(first)).ok());
  EXPECT_FALSE(FrameSeal::Accepting(kKey)->Open(FrameKind::kResult, 7, Span(first)).ok());
  // Another deployment's secret.
  EXPECT_FALSE(
      FrameSeal::Accepting(std::string(32, 'x'))->Open(FrameKind::kPlan, 7, Span(first)).ok());
  // Not sealed at all.
  const auto plain = FrameSeal::Accepting(kKey)->Open(FrameKind::kPlan, 7, Span("plan seven"));
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(plain.status().message().find("not sealed"), absl::string_view::npos);
  // A frame of another connection (same deployment) once this one has begun.
  auto node = FrameSeal::Accepting(kKey);
  ASSERT_TRUE(node->Open(FrameKind::kPlan, 7, Span(first)).ok());
  auto other = FrameSeal::Connecting(kKey);
  SealOrDie(*other, FrameKind::kPlan, 1, "x");
  const std::string foreign = SealOrDie(*other, FrameKind::kPlan, 8, "plan eight");
  const auto moved = node->Open(FrameKind::kPlan, 8, Span(foreign));
  EXPECT_FALSE(moved.ok());
  EXPECT_NE(moved.status().message().find("another connection"), absl::string_view::npos);
  // The connection itself goes on.
  EXPECT_TRUE(node->Open(FrameKind::kPlan, 8,
                         Span(SealOrDie(*scheduler, FrameKind::kPlan, 8, "plan eight")))
                  .ok());
}

TEST(FrameSealTest, WithoutADeploymentKeyNothingIsSealed) {
  EXPECT_FALSE(FrameSeal::Connecting("")->enabled());
  EXPECT_FALSE(FrameSeal::Accepting("")->enabled());
}

}  // namespace
}  // namespace strata
