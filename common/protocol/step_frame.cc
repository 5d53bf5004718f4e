#include "common/protocol/step_frame.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata {

using transport::FrameHeader;
using transport::FrameKind;

void SendMessageFrame(transport::Transport& transport, transport::PeerId peer, FrameKind kind,
                      uint64_t step_id, const google::protobuf::MessageLite& message,
                      transport::SendDone done) {
  auto body = std::make_shared<std::string>(message.SerializeAsString());
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(body->data()),
                                       body->size());
  FrameHeader h;
  h.kind = static_cast<uint16_t>(kind);
  h.step_id = step_id;
  h.payload_bytes = bytes.size();
  h.checksum = transport::PayloadChecksum(bytes);
  transport.Send(peer, transport::kFrameTag, transport::AsBytes(h), {bytes},
                 [body, done = std::move(done)](absl::Status status) {
                   if (done) done(std::move(status));
                 });
}

absl::Status ReadMessageFrame(std::span<const uint8_t> header, std::span<const uint8_t> payload,
                              const absl::Status& status, FrameKind kind,
                              google::protobuf::MessageLite* message, uint64_t* step_id) {
  FrameHeader h;
  const absl::Status header_ok = transport::ParseFrameHeader(header, &h);
  if (header_ok.ok()) *step_id = h.step_id;
  if (!status.ok()) return status;
  if (!header_ok.ok()) return header_ok;
  if (h.kind != static_cast<uint16_t>(kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", transport::FrameKindName(h.kind), " frame where a ",
                     transport::FrameKindName(static_cast<uint16_t>(kind)), " frame was expected"));
  }
  if (absl::Status checked = transport::CheckFramePayload(h, payload, /*verify=*/true);
      !checked.ok()) {
    return checked;
  }
  if (!message->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("the ", transport::FrameKindName(h.kind),
                                                   " frame of step ", h.step_id, " is not a valid ",
                                                   message->GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace strata
