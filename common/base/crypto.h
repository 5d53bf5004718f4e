// Small cryptographic helpers on OpenSSL's libcrypto, for authenticating the processes of a
// deployment to each other (common/control/cluster_auth.h, the data-plane bootstrap):
// HMAC-SHA256, random bytes from the OS generator, and a comparison that takes the same
// time wherever the inputs differ.
#ifndef STRATA_COMMON_BASE_CRYPTO_H_
#define STRATA_COMMON_BASE_CRYPTO_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

inline constexpr size_t kHmacSha256Bytes = 32;

// HMAC-SHA256(key, message): 32 raw bytes.
std::string HmacSha256(std::string_view key, std::string_view message);

// `n` bytes from the OS's cryptographic generator. CHECK-fails if it has none.
std::string SecureRandomBytes(size_t n);

// a == b, in time that depends only on the sizes.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// Lower-case hexadecimal.
std::string HexEncode(std::string_view bytes);

// Calls refused for missing or wrong credentials since the process started, by channel.
// Exported as strata_unauthenticated_total{channel="control"|"data_plane"}.
struct AuthRefusals {
  std::atomic<uint64_t> control{0};
  std::atomic<uint64_t> data_plane{0};
};
AuthRefusals& ProcessAuthRefusals();

}  // namespace strata

#endif  // STRATA_COMMON_BASE_CRYPTO_H_
