// Protobuf messages as data-plane frames (common/transport/frame.h): the step channel's
// plans and results (compute_node/step_channel.h, server/data_plane_executor.h). A frame
// carries the message serialized as its payload, under the usual header with the step id
// and the payload's checksum; where the deployment has a secret, the payload is sealed
// (FrameSeal).
#ifndef STRATA_COMMON_PROTOCOL_STEP_FRAME_H_
#define STRATA_COMMON_PROTOCOL_STEP_FRAME_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "google/protobuf/message_lite.h"

namespace strata {

// Sealing of one step-channel connection's frames, where the deployment has a secret (the
// data-plane key): plans carry prompts' tokens and grammars, results the sampled tokens, and
// the data plane has no encryption of its own. The transport's bootstrap only checks who
// connects; sealing hides what the frames say and refuses any frame that was altered,
// replayed, dropped, reordered, or taken from another connection.
//
// AES-256-GCM under a key of the connection's own, HMAC-SHA256(deployment key, label ||
// connection nonce): the connecting side (the scheduler) draws the 16-byte nonce, every
// sealed frame carries it, and the accepting side (the compute node) takes it from the
// connection's first frame. Each direction numbers its frames from 1, and a frame opens
// only with the next number of its direction; the GCM nonce is the frame's kind and that
// number, so the two directions never share one. The frame header's kind and step id are
// authenticated with the payload.
//
// Sealed payload: "SSF1", the connection nonce (16 bytes), the number (8, little-endian),
// the ciphertext, the tag (16).
//
// Thread-safety: thread-safe (one direction's frames are sealed on one thread, the other's
// opened on another).
class FrameSeal {
 public:
  static constexpr size_t kConnectionNonceBytes = 16;
  static constexpr size_t kPrefixBytes = 4 + kConnectionNonceBytes + 8;

  // The connecting side's, with a fresh connection nonce. An empty key: frames are not
  // sealed (a deployment without a secret).
  static std::shared_ptr<FrameSeal> Connecting(std::string_view deployment_key);
  // The accepting side's: the connection nonce comes with the first frame it opens.
  static std::shared_ptr<FrameSeal> Accepting(std::string_view deployment_key);

  bool enabled() const { return !deployment_key_.empty(); }
  // The sealed payload of a frame of `kind` for step `step_id`. FailedPrecondition on the
  // accepting side before a frame opened (it has no key yet).
  absl::StatusOr<std::string> Seal(transport::FrameKind kind, uint64_t step_id,
                                   std::string_view plaintext);
  // The plaintext of a sealed payload. PermissionDenied for a frame that is not sealed or
  // does not open (altered, replayed, out of order, another connection's, another key's).
  absl::StatusOr<std::string> Open(transport::FrameKind kind, uint64_t step_id,
                                   std::span<const uint8_t> payload);

 private:
  FrameSeal(std::string_view deployment_key, std::string connection_nonce);
  void SetConnectionNonceLocked(std::string nonce);

  const std::string deployment_key_;
  std::mutex mu_;
  std::string connection_nonce_;  // empty: not known yet (accepting side)
  std::string key_;               // the connection's AES-256 key
  uint64_t sent_ = 0;             // frames sealed
  uint64_t opened_ = 0;           // frames opened
};

// Sends `message` to `peer` as a frame of `kind` for step `step_id`, sealed by `seal` if it
// is given and enabled (unsealed where it cannot seal yet: the answer to a first frame that
// did not open). The serialized copy lives until the send is over; `done` (may be empty)
// then gets its outcome.
void SendMessageFrame(transport::Transport& transport, transport::PeerId peer,
                      transport::FrameKind kind, uint64_t step_id,
                      const google::protobuf::MessageLite& message, transport::SendDone done,
                      FrameSeal* seal = nullptr);

// Reads a received frame of `kind` into `message`: the receive's `status`, the header, the
// kind (InvalidArgument if another), the payload's size and checksum (DataLoss), the seal
// if `seal` is given and enabled (PermissionDenied), then the message itself
// (InvalidArgument if it does not parse). `step_id` gets the header's step id whenever the
// header parses, so that an error can name the frame it answers.
absl::Status ReadMessageFrame(std::span<const uint8_t> header, std::span<const uint8_t> payload,
                              const absl::Status& status, transport::FrameKind kind,
                              google::protobuf::MessageLite* message, uint64_t* step_id,
                              FrameSeal* seal = nullptr);

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_STEP_FRAME_H_
