// The first message on every connection (tag 0): the connecting side says which data-plane
// version it speaks, and the listening side accepts or refuses. Shared by the backends.
#ifndef STRATA_COMMON_TRANSPORT_HANDSHAKE_H_
#define STRATA_COMMON_TRANSPORT_HANDSHAKE_H_

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::transport {

inline constexpr uint32_t kHandshakeMagic = 0x53545248;  // "STRH"
// Bumped whenever the framing of data-plane messages changes (common/transport/frame.h)
// or how a connection is kept. 2: the bootstrap's socket stays open as the connection's
// liveness socket (ucx_bootstrap.h), and a rotated step's replica may send a kError frame
// in place of a context. 3: a context frame names the pools whose memory nodes failed the
// step after its rows (compute_node/context_exchange.h).
inline constexpr uint32_t kCurrentDataPlaneVersion = 3;
// What this build speaks: the current version, except in the test build of a node of the
// version before (//common/transport:transport_peer_previous, for the tests of nodes of two
// builds meeting), whose handshake is otherwise the same.
#ifdef STRATA_PREVIOUS_DATA_PLANE_VERSION
inline constexpr uint32_t kDataPlaneVersion = kCurrentDataPlaneVersion - 1;
#else
inline constexpr uint32_t kDataPlaneVersion = kCurrentDataPlaneVersion;
#endif

struct Handshake {
  enum Kind : uint32_t { kHello = 1, kAccept = 2, kRefuse = 3 };
  uint32_t magic = kHandshakeMagic;
  uint32_t version = kDataPlaneVersion;
  uint32_t kind = kHello;
  uint32_t reserved = 0;
};
static_assert(sizeof(Handshake) == 16);

inline std::span<const uint8_t> AsBytes(const Handshake& h) {
  return {reinterpret_cast<const uint8_t*>(&h), sizeof(h)};
}

// Parses a handshake header; fails on a wrong size or magic.
inline absl::Status ParseHandshake(std::span<const uint8_t> bytes, Handshake* out) {
  if (bytes.size() != sizeof(Handshake)) {
    return absl::InvalidArgumentError(
        absl::StrCat("handshake of ", bytes.size(), " bytes, want ", sizeof(Handshake)));
  }
  std::memcpy(out, bytes.data(), sizeof(Handshake));
  if (out->magic != kHandshakeMagic) {
    return absl::InvalidArgumentError("handshake with a wrong magic number");
  }
  return absl::OkStatus();
}

inline absl::Status CheckPeerVersion(uint32_t version) {
  if (version == kDataPlaneVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("peer speaks data-plane version ", version,
                                                    "; this node speaks ", kDataPlaneVersion));
}

}  // namespace strata::transport

#endif  // STRATA_COMMON_TRANSPORT_HANDSHAKE_H_
