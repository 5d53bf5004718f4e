// Protobuf messages as data-plane frames (common/transport/frame.h): the step channel's
// plans and results (compute_node/step_channel.h, server/data_plane_executor.h). A frame
// carries the message serialized as its payload, under the usual header with the step id
// and the payload's checksum.
#ifndef STRATA_COMMON_PROTOCOL_STEP_FRAME_H_
#define STRATA_COMMON_PROTOCOL_STEP_FRAME_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "google/protobuf/message_lite.h"

namespace strata {

// Sends `message` to `peer` as a frame of `kind` for step `step_id`. The serialized copy
// lives until the send is over; `done` (may be empty) then gets its outcome.
void SendMessageFrame(transport::Transport& transport, transport::PeerId peer,
                      transport::FrameKind kind, uint64_t step_id,
                      const google::protobuf::MessageLite& message, transport::SendDone done);

// Reads a received frame of `kind` into `message`: the receive's `status`, the header, the
// kind (InvalidArgument if another), the payload's size and checksum (DataLoss), then the
// message itself (InvalidArgument if it does not parse). `step_id` gets the header's step
// id whenever the header parses, so that an error can name the frame it answers.
absl::Status ReadMessageFrame(std::span<const uint8_t> header, std::span<const uint8_t> payload,
                              const absl::Status& status, transport::FrameKind kind,
                              google::protobuf::MessageLite* message, uint64_t* step_id);

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_STEP_FRAME_H_
