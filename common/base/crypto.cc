#include "common/base/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/base/logging.h"

namespace strata {

std::string HmacSha256(std::string_view key, std::string_view message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  // An empty key is a valid HMAC key; OpenSSL wants a non-null pointer for it.
  static const unsigned char kEmpty = 0;
  const void* key_data = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  CHECK(HMAC(EVP_sha256(), key_data, static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(message.data()), message.size(), out,
             &size) != nullptr)
      << "HMAC-SHA256 failed";
  CHECK_EQ(size, kHmacSha256Bytes);
  return std::string(reinterpret_cast<const char*>(out), size);
}

std::string SecureRandomBytes(size_t n) {
  std::string out(n, '\0');
  CHECK_EQ(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)), 1)
      << "the OS random generator failed";
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string HexEncode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

AuthRefusals& ProcessAuthRefusals() {
  static AuthRefusals refusals;
  return refusals;
}

}  // namespace strata
