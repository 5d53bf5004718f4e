// Small cryptographic helpers on OpenSSL's libcrypto, for authenticating the processes of a
// deployment to each other (common/control/cluster_auth.h, the data-plane bootstrap) and
// sealing the step channel's frames (common/protocol/step_frame.h): HMAC-SHA256, AES-256-GCM,
// random bytes from the OS generator, and a comparison that takes the same time wherever
// the inputs differ.
#ifndef STRATA_COMMON_BASE_CRYPTO_H_
#define STRATA_COMMON_BASE_CRYPTO_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

inline constexpr size_t kHmacSha256Bytes = 32;

// HMAC-SHA256(key, message): 32 raw bytes.
std::string HmacSha256(std::string_view key, std::string_view message);

inline constexpr size_t kAes256GcmKeyBytes = 32;
inline constexpr size_t kAes256GcmNonceBytes = 12;
inline constexpr size_t kAes256GcmTagBytes = 16;

// AES-256-GCM: `plaintext` encrypted under `key` (32 bytes) and `nonce` (12 bytes, never
// used twice with one key), with `aad` authenticated but not encrypted. Returns the
// ciphertext followed by the 16-byte tag. CHECK-fails on a key or nonce of another size.
std::string Aes256GcmSeal(std::string_view key, std::string_view nonce, std::string_view aad,
                          std::string_view plaintext);

// Opens what Aes256GcmSeal made: the plaintext, or nullopt if the ciphertext, the tag, the
// aad, the key or the nonce differ from the sealing's (or `sealed` is shorter than a tag).
std::optional<std::string> Aes256GcmOpen(std::string_view key, std::string_view nonce,
                                         std::string_view aad, std::string_view sealed);

// AES-256-GCM under one key whose cipher contexts (the key schedule and the hash key) are
// set up once, for a connection that seals or opens many messages: Seal and Open give
// exactly what the functions above give for that key. Not thread-safe.
class Aes256GcmKey {
 public:
  // CHECK-fails on a key of another size.
  explicit Aes256GcmKey(std::string_view key);
  ~Aes256GcmKey();
  Aes256GcmKey(const Aes256GcmKey&) = delete;
  Aes256GcmKey& operator=(const Aes256GcmKey&) = delete;

  std::string Seal(std::string_view nonce, std::string_view aad, std::string_view plaintext);
  std::optional<std::string> Open(std::string_view nonce, std::string_view aad,
                                  std::string_view sealed);

 private:
  struct Contexts;
  std::unique_ptr<Contexts> contexts_;
};

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
