// The frame format: error frames carry a status, code and message, from the memory node to
// the compute node; payload checksums and header parsing catch damage.
#include "common/transport/frame.h"

#include <string>

#include "common/transport/transport_testing.h"
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

// k/v rows travel in the KV cache's own type: a memory node checks a frame's type against
// its cache's, so each cache type has a frame type of its own.
TEST(Frame, KvRowsTravelInTheCachesType) {
  EXPECT_EQ(FrameDTypeOf(KvDType::kBF16), FrameDType::kBF16);
  EXPECT_EQ(FrameDTypeOf(KvDType::kF16), FrameDType::kF16);
}

TEST(Frame, ChecksumIgnoresHowThePayloadIsSplit) {
  const auto data = Bytes(10007, 9);
  const uint64_t whole = PayloadChecksum(data);
  for (size_t cut1 : {0u, 1u, 63u, 64u, 65u, 5000u}) {
    for (size_t cut2 : {cut1, cut1 + 1, cut1 + 64, size_t{9999}}) {
      if (cut2 < cut1 || cut2 > data.size()) continue;
      const std::span<const uint8_t> all(data);
      const std::span<const uint8_t> parts[] = {all.first(cut1), all.subspan(cut1, cut2 - cut1),
                                                all.subspan(cut2)};
      EXPECT_EQ(PayloadChecksum(parts), whole) << cut1 << " " << cut2;
    }
  }
}

TEST(Frame, ChecksumCatchesFlipsTruncationAndZeros) {
  auto data = Bytes(4096, 11);
  const uint64_t base = PayloadChecksum(data);
  for (size_t byte : {0u, 1u, 100u, 4095u}) {
    for (int bit = 0; bit < 8; ++bit) {
      data[byte] ^= 1 << bit;
      EXPECT_NE(PayloadChecksum(data), base) << byte << ":" << bit;
      data[byte] ^= 1 << bit;
    }
  }
  EXPECT_NE(PayloadChecksum(std::span<const uint8_t>(data).first(4095)), base);
  // Zero payloads of different lengths differ.
  std::vector<uint8_t> zeros(128, 0);
  EXPECT_NE(PayloadChecksum(std::span<const uint8_t>(zeros).first(64)), PayloadChecksum(zeros));
  // Swapping two 8-byte words is caught.
  std::swap_ranges(data.begin(), data.begin() + 8, data.begin() + 64);
  EXPECT_NE(PayloadChecksum(data), base);
}

TEST(Frame, HeaderParsingRejectsGarbage) {
  FrameHeader h;
  h.kind = static_cast<uint16_t>(FrameKind::kLayer);
  FrameHeader out;
  EXPECT_TRUE(ParseFrameHeader(AsBytes(h), &out).ok());
  EXPECT_FALSE(ParseFrameHeader(AsBytes(h).first(10), &out).ok());
  FrameHeader bad = h;
  bad.magic = 0;
  EXPECT_FALSE(ParseFrameHeader(AsBytes(bad), &out).ok());
  bad = h;
  bad.version = kFrameVersion + 1;
  EXPECT_EQ(ParseFrameHeader(AsBytes(bad), &out).code(), absl::StatusCode::kFailedPrecondition);
  bad = h;
  bad.kind = 99;
  EXPECT_FALSE(ParseFrameHeader(AsBytes(bad), &out).ok());
  const auto payload = Bytes(100, 1);
  h.payload_bytes = payload.size();
  h.checksum = PayloadChecksum(payload);
  EXPECT_TRUE(CheckFramePayload(h, payload, true).ok());
  EXPECT_FALSE(CheckFramePayload(h, std::span<const uint8_t>(payload).first(99), true).ok());
  auto corrupt = payload;
  corrupt[50] ^= 4;
  EXPECT_EQ(CheckFramePayload(h, corrupt, true).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(CheckFramePayload(h, corrupt, false).ok());  // verification off
}

}  // namespace
}  // namespace strata::transport
