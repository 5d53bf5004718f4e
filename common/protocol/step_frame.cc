#include "common/protocol/step_frame.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/crypto.h"

namespace strata {

using transport::FrameHeader;
using transport::FrameKind;

namespace {

constexpr char kSealMagic[4] = {'S', 'S', 'F', '2'};
constexpr std::string_view kKeyLabel = "strata step channel v2";

std::string Uint64Bytes(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

uint64_t Uint64At(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// The GCM nonce: the frame's kind (4 bytes, little-endian), then its number.
std::string GcmNonce(FrameKind kind, uint64_t number) {
  return Uint64Bytes(static_cast<uint32_t>(kind)).substr(0, 4) + Uint64Bytes(number);
}

// What the tag covers besides the ciphertext: the header's kind and step id, and the prefix.
std::string Aad(FrameKind kind, uint64_t step_id, std::string_view prefix) {
  std::string aad = Uint64Bytes(static_cast<uint16_t>(kind)).substr(0, 2);
  aad += Uint64Bytes(step_id);
  aad += prefix;
  return aad;
}

}  // namespace

FrameSeal::FrameSeal(std::string_view deployment_key, std::string_view connection_secret)
    : enabled_(!deployment_key.empty()),
      cipher_(deployment_key.empty() || connection_secret.empty()
                  ? nullptr
                  : std::make_unique<Aes256GcmKey>(HmacSha256(
                        deployment_key, std::string(kKeyLabel) + std::string(connection_secret)))) {
}

absl::StatusOr<std::string> FrameSeal::Seal(FrameKind kind, uint64_t step_id,
                                            std::string_view plaintext) {
  if (cipher_ == nullptr) {
    return absl::FailedPreconditionError("the connection has no secret to seal its frames with");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t number = ++sent_;
  std::string out(kSealMagic, sizeof(kSealMagic));
  out += Uint64Bytes(number);
  out += cipher_->Seal(GcmNonce(kind, number), Aad(kind, step_id, out), plaintext);
  return out;
}

absl::StatusOr<std::string> FrameSeal::Open(FrameKind kind, uint64_t step_id,
                                            std::span<const uint8_t> payload) {
  if (cipher_ == nullptr) {
    return absl::FailedPreconditionError("the connection has no secret to open its frames with");
  }
  const std::string_view bytes(reinterpret_cast<const char*>(payload.data()), payload.size());
  if (bytes.size() < kPrefixBytes + kAes256GcmTagBytes ||
      std::memcmp(bytes.data(), kSealMagic, sizeof(kSealMagic)) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the ", transport::FrameKindName(static_cast<uint16_t>(kind)), " frame of step ", step_id,
        " is not sealed, and this deployment seals its step frames"));
  }
  const uint64_t number = Uint64At(payload.data() + sizeof(kSealMagic));
  std::lock_guard<std::mutex> lock(mu_);
  if (number <= opened_) {
    return absl::PermissionDeniedError(
        absl::StrCat("the frame of step ", step_id, " is number ", number, ", not above ", opened_,
                     ", the last one opened (replayed or reordered)"));
  }
  std::optional<std::string> plain =
      cipher_->Open(GcmNonce(kind, number), Aad(kind, step_id, bytes.substr(0, kPrefixBytes)),
                    bytes.substr(kPrefixBytes));
  if (!plain) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the sealed frame of step ", step_id,
        " does not open (altered, another connection's, or another deployment's secret)"));
  }
  opened_ = number;
  return std::move(*plain);
}

void SendMessageFrame(transport::Transport& transport, transport::PeerId peer, FrameKind kind,
                      uint64_t step_id, const google::protobuf::MessageLite& message,
                      transport::SendDone done, FrameSeal* seal) {
  auto body = std::make_shared<std::string>(message.SerializeAsString());
  if (seal != nullptr && seal->enabled()) {
    absl::StatusOr<std::string> sealed = seal->Seal(kind, step_id, *body);
    if (!sealed.ok()) {
      if (done) done(sealed.status());
      return;
    }
    *body = std::move(*sealed);
  }
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
                              google::protobuf::MessageLite* message, uint64_t* step_id,
                              FrameSeal* seal) {
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
  if (payload.size() > kMaxStepFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a ", transport::FrameKindName(h.kind),
                                                   " frame of ", payload.size(), " bytes (at most ",
                                                   kMaxStepFrameBytes, ")"));
  }
  if (absl::Status checked = transport::CheckFramePayload(h, payload, /*verify=*/true);
      !checked.ok()) {
    return checked;
  }
  std::string opened;
  if (seal != nullptr && seal->enabled()) {
    absl::StatusOr<std::string> plain = seal->Open(kind, h.step_id, payload);
    if (!plain.ok()) return plain.status();
    opened = std::move(*plain);
    payload =
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(opened.data()), opened.size());
  }
  if (!message->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("the ", transport::FrameKindName(h.kind),
                                                   " frame of step ", h.step_id, " is not a valid ",
                                                   message->GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace strata
