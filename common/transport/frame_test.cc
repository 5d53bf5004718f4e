// Error frames carry a status, code and message, from the memory node to the compute node.
#include "common/transport/frame.h"

#include <string>

#include "gtest/gtest.h"

namespace strata::transport {
namespace {

FrameHeader About() {
  FrameHeader h;
  h.kind = static_cast<uint16_t>(FrameKind::kLayer);
  h.step_id = 41;
  h.epoch = 3;
  h.layer = 5;
  h.minibatch = 2;
  return h;
}

TEST(ErrorFrameTest, EveryErrorCodeSurvivesTheFrame) {
  for (int code = 1; code <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++code) {
    const absl::Status sent(static_cast<absl::StatusCode>(code), "why " + std::to_string(code));
    std::string text;
    const FrameHeader h = ErrorFrameHeader(About(), sent, &text);
    EXPECT_EQ(h.kind, static_cast<uint16_t>(FrameKind::kError));
    // It answers the frame it is about.
    EXPECT_EQ(h.step_id, 41u);
    EXPECT_EQ(h.layer, 5u);
    EXPECT_EQ(h.minibatch, 2u);
    const std::span<const uint8_t> body(reinterpret_cast<const uint8_t*>(text.data()), text.size());
    EXPECT_TRUE(CheckFramePayload(h, body, /*verify=*/true).ok());
    FrameHeader parsed;
    ASSERT_TRUE(ParseFrameHeader(AsBytes(h), &parsed).ok());
    EXPECT_EQ(ErrorFrameStatus(parsed, body), sent);
  }
}

TEST(ErrorFrameTest, ACodeThatIsNotAnErrorReadsAsInternal) {
  std::string text = "something failed";
  const std::span<const uint8_t> body(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  FrameHeader h = About();
  h.kind = static_cast<uint16_t>(FrameKind::kError);
  for (uint16_t flags : {uint16_t{0}, uint16_t{17}, uint16_t{999}}) {
    h.flags = flags;
    const absl::Status status = ErrorFrameStatus(h, body);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << flags;
    EXPECT_EQ(status.message(), text);
  }
}

TEST(ErrorFrameTest, LongMessagesAreCut) {
  const absl::Status sent = absl::InvalidArgumentError(std::string(3 * kMaxErrorText, 'x'));
  std::string text;
  const FrameHeader h = ErrorFrameHeader(About(), sent, &text);
  EXPECT_EQ(text.size(), kMaxErrorText);
  EXPECT_EQ(h.payload_bytes, kMaxErrorText);
  const std::span<const uint8_t> body(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  EXPECT_EQ(ErrorFrameStatus(h, body).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::transport
