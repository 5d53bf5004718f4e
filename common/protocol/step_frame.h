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
#include "common/base/crypto.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"
#include "google/protobuf/message_lite.h"

namespace strata {

// Sealing of one step-channel connection's frames, where the deployment has a secret (the
// data-plane key): plans carry prompts' tokens and grammars, results the sampled tokens, and
// the data plane has no encryption of its own. The transport's bootstrap only checks who
// connects; sealing hides what the frames say and refuses any frame that was altered,
// replayed, reordered, or taken from another connection.
//
// AES-256-GCM under a key of the connection's own, HMAC-SHA256(deployment key, label ||
// the connection's secret): Transport::PeerSecret, which both ends of one connection share
// and no other connection has (UCX derives it from the bootstrap's two fresh nonces). Each
// direction numbers its frames from 1, and a frame opens only with a number above the last
// one opened in its direction: a replayed or reordered frame does not open, while a frame
// refused before its seal was checked (a bad checksum, a failed receive) leaves a gap that
// costs only that frame. The GCM nonce is the frame's kind and its number, so the two
// directions never share one. The frame header's kind and step id are authenticated with
// the payload.
//
// Sealed payload: "SSF2", the number (8 bytes, little-endian), the ciphertext, the tag (16).
//
// Thread-safety: thread-safe (one direction's frames are sealed on one thread, the other's
// opened on another).
class FrameSeal {
 public:
  static constexpr size_t kPrefixBytes = 4 + 8;

  // The seal of a connection whose transport secret is `connection_secret`. An empty
  // deployment key: frames are not sealed (a deployment without a secret). A deployment key
  // without a connection secret: nothing seals or opens (FailedPrecondition).
  FrameSeal(std::string_view deployment_key, std::string_view connection_secret);

  bool enabled() const { return enabled_; }
  // The sealed payload of a frame of `kind` for step `step_id`.
  absl::StatusOr<std::string> Seal(transport::FrameKind kind, uint64_t step_id,
                                   std::string_view plaintext);
  // The plaintext of a sealed payload. PermissionDenied for a frame that is not sealed or
  // does not open (altered, replayed, reordered, another connection's or key's).
  absl::StatusOr<std::string> Open(transport::FrameKind kind, uint64_t step_id,
                                   std::span<const uint8_t> payload);

 private:
  const bool enabled_;
  // The connection's AES-256 key (from the deployment key and the connection secret), used
  // under mu_; null without a secret.
  const std::unique_ptr<Aes256GcmKey> cipher_;
  std::mutex mu_;
  uint64_t sent_ = 0;    // the last number sealed
  uint64_t opened_ = 0;  // the last number opened
};

// Sends `message` to `peer` as a frame of `kind` for step `step_id`, sealed by `seal` if it
// is given and enabled (a seal that cannot seal fails the send: `done` gets why). The serialized
// copy lives until the send is over; `done` (may be empty) then gets its outcome.
void SendMessageFrame(transport::Transport& transport, transport::PeerId peer,
                      transport::FrameKind kind, uint64_t step_id,
                      const google::protobuf::MessageLite& message, transport::SendDone done,
                      FrameSeal* seal = nullptr);

// The largest step plan or result frame's payload, as the gRPC step stream's messages
// (256 MiB). The channels' transports hold no larger copy, and a larger frame is refused
// before it is opened or parsed (protobuf reads at most 2 GiB, and aborts past it).
inline constexpr size_t kMaxStepFrameBytes = size_t{256} << 20;

// Reads a received frame of `kind` into `message`: the receive's `status`, the header, the
// kind (InvalidArgument if another), its size (InvalidArgument past kMaxStepFrameBytes),
// the payload's size and checksum (DataLoss), the seal
// if `seal` is given and enabled (PermissionDenied), then the message itself
// (InvalidArgument if it does not parse). `step_id` gets the header's step id whenever the
// header parses, so that an error can name the frame it answers.
absl::Status ReadMessageFrame(std::span<const uint8_t> header, std::span<const uint8_t> payload,
                              const absl::Status& status, transport::FrameKind kind,
                              google::protobuf::MessageLite* message, uint64_t* step_id,
                              FrameSeal* seal = nullptr);

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_STEP_FRAME_H_
