// Framing of data-plane messages between compute and memory nodes (docs/architecture.md,
// "A step of decoding").
//
// Every message carries a fixed 64-byte FrameHeader as its transport header: magic,
// version, kind, step, layer, mini-batch, rows, dtype, payload size and a checksum of the
// payload. The checksum is always computed by the sender; the receiver verifies it unless
// told not to, and a mismatch is an error that is counted, never ignored.
//
//   kind          payload
//   kStep         a serialized StepDescriptor (proto/data_plane.proto), once per step
//   kLayer        q of the rows that attend here, then k and v of every row of the
//                 mini-batch (bf16/f16 rows, as the descriptor describes)
//   kLayerResult  bf16 attention output of the final rows, then f32 fold states
//                 ([heads][head_dim + 2]) of the partial rows
//   kError        UTF-8 text: why the step (or one layer message) failed; the header's
//                 `flags` carry its absl::StatusCode (ErrorFrameStatus reads both)
//   kHello        none: names the connection's endpoint (`reserved`), so that a memory
//                 node can route answers of a rotated step to it (rotational pipelining);
//                 at a context exchange, the address the sending replica listens at
//   kContext      f32 residual-stream rows of a batch ([rows][hidden]), handed from the
//                 compute replica that ran one slice of the layers to the one that runs the
//                 next (`layer`: the slice that continues; `minibatch`: the batch slot)
//   kPlan         a serialized strata.control.StepPlan, from the scheduler to a compute
//                 node over its step channel (compute_node/step_channel.h)
//   kResult       a serialized strata.control.StepResult, the node's answer to one kPlan
//
// Rotational pipelining routes answers: a kStep or kLayer frame whose `reserved` is not
// zero asks the memory node to answer the endpoint of that id (announced by kHello), not
// the sender; such a step is keyed by its id rather than by the connection.
#ifndef STRATA_COMMON_TRANSPORT_FRAME_H_
#define STRATA_COMMON_TRANSPORT_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "common/model/kv_dtype.h"
#include "common/transport/transport.h"

namespace strata::transport {

inline constexpr uint32_t kFrameMagic = 0x5354524C;  // "STRL"
inline constexpr uint16_t kFrameVersion = 1;

enum class FrameKind : uint16_t {
  kStep = 1,
  kLayer = 2,
  kLayerResult = 3,
  kError = 4,
  kHello = 5,
  kContext = 6,
  kPlan = 7,
  kResult = 8,
};

// All data-plane frames travel under one transport tag.
inline constexpr Tag kFrameTag = 1;

enum class FrameDType : uint16_t { kBF16 = 0, kF16 = 1, kF32 = 2 };
// The frame type of k/v rows of a KV cache of type `kv`.
inline FrameDType FrameDTypeOf(KvDType kv) {
  return kv == KvDType::kF16 ? FrameDType::kF16 : FrameDType::kBF16;
}

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kFrameVersion;
  uint16_t kind = 0;
  uint64_t step_id = 0;
  uint64_t epoch = 0;  // the scheduler incarnation the step belongs to
  uint32_t layer = 0;
  uint32_t minibatch = 0;
  uint32_t rows = 0;   // rows of the mini-batch
  uint16_t dtype = 0;  // FrameDType of the k/v rows
  uint16_t flags = 0;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;  // PayloadChecksum of the payload
  uint64_t reserved = 0;
};
static_assert(sizeof(FrameHeader) == 64, "the frame header is 64 bytes on the wire");

// A 64-bit checksum of the concatenation of `parts` (not cryptographic: it catches
// corruption and truncation). Runs at memory speed.
uint64_t PayloadChecksum(std::span<const std::span<const uint8_t>> parts);
inline uint64_t PayloadChecksum(std::span<const uint8_t> bytes) {
  const std::span<const uint8_t> one[] = {bytes};
  return PayloadChecksum(one);
}

inline std::span<const uint8_t> AsBytes(const FrameHeader& header) {
  return {reinterpret_cast<const uint8_t*>(&header), sizeof(header)};
}

// Parses and checks a received header: size, magic, version and kind. Says what is wrong.
absl::Status ParseFrameHeader(std::span<const uint8_t> bytes, FrameHeader* out);

// Checks the payload against the header's size and (when `verify`) checksum.
absl::Status CheckFramePayload(const FrameHeader& header, std::span<const uint8_t> payload,
                               bool verify);

std::string FrameKindName(uint16_t kind);

// An error frame answering `about`: its header (kind kError, the status code in `flags`)
// and its payload, the status message cut to kMaxErrorText bytes. `status` is not OK.
inline constexpr size_t kMaxErrorText = 4096;
FrameHeader ErrorFrameHeader(const FrameHeader& about, const absl::Status& status,
                             std::string* text);
// The status an error frame carries. A code that is not an error (OK, or outside
// absl::StatusCode) reads as Internal, so that an error frame is never taken for success.
absl::Status ErrorFrameStatus(const FrameHeader& header, std::span<const uint8_t> payload);

}  // namespace strata::transport

#endif  // STRATA_COMMON_TRANSPORT_FRAME_H_
