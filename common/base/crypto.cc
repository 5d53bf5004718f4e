#include "common/base/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <memory>

#include "common/base/logging.h"

namespace strata {
namespace {

const unsigned char* Bytes(std::string_view s) {
  // OpenSSL wants non-null pointers even for empty inputs.
  static const unsigned char kEmpty = 0;
  return s.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(s.data());
}

struct CipherContextFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using CipherContext = std::unique_ptr<EVP_CIPHER_CTX, CipherContextFree>;

}  // namespace

struct Aes256GcmKey::Contexts {
  CipherContext seal{EVP_CIPHER_CTX_new()};
  CipherContext open{EVP_CIPHER_CTX_new()};
};

Aes256GcmKey::Aes256GcmKey(std::string_view key) : contexts_(std::make_unique<Contexts>()) {
  CHECK_EQ(key.size(), kAes256GcmKeyBytes);
  CHECK(contexts_->seal != nullptr && contexts_->open != nullptr);
  // The key now, each message's nonce later (EVP keeps the key when given none).
  CHECK_EQ(
      EVP_EncryptInit_ex(contexts_->seal.get(), EVP_aes_256_gcm(), nullptr, Bytes(key), nullptr),
      1);
  CHECK_EQ(
      EVP_DecryptInit_ex(contexts_->open.get(), EVP_aes_256_gcm(), nullptr, Bytes(key), nullptr),
      1);
}

Aes256GcmKey::~Aes256GcmKey() = default;

std::string Aes256GcmKey::Seal(std::string_view nonce, std::string_view aad,
                               std::string_view plaintext) {
  CHECK_EQ(nonce.size(), kAes256GcmNonceBytes);
  EVP_CIPHER_CTX* ctx = contexts_->seal.get();
  std::string out(plaintext.size() + kAes256GcmTagBytes, '\0');
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  int n = 0;
  CHECK_EQ(EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, Bytes(nonce)), 1);
  CHECK_EQ(EVP_EncryptUpdate(ctx, nullptr, &n, Bytes(aad), static_cast<int>(aad.size())), 1);
  CHECK_EQ(EVP_EncryptUpdate(ctx, o, &n, Bytes(plaintext), static_cast<int>(plaintext.size())), 1);
  int tail = 0;
  CHECK_EQ(EVP_EncryptFinal_ex(ctx, o + n, &tail), 1);
  CHECK_EQ(static_cast<size_t>(n + tail), plaintext.size());
  CHECK_EQ(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kAes256GcmTagBytes, o + plaintext.size()),
           1);
  return out;
}

std::optional<std::string> Aes256GcmKey::Open(std::string_view nonce, std::string_view aad,
                                              std::string_view sealed) {
  if (nonce.size() != kAes256GcmNonceBytes || sealed.size() < kAes256GcmTagBytes) {
    return std::nullopt;
  }
  EVP_CIPHER_CTX* ctx = contexts_->open.get();
  const size_t length = sealed.size() - kAes256GcmTagBytes;
  std::string out(length, '\0');
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  int n = 0;
  if (EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, Bytes(nonce)) != 1 ||
      EVP_DecryptUpdate(ctx, nullptr, &n, Bytes(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_DecryptUpdate(ctx, o, &n, Bytes(sealed), static_cast<int>(length)) != 1) {
    return std::nullopt;
  }
  // The expected tag; EVP takes a non-const pointer but does not write through it.
  std::string tag(sealed.substr(length));
  if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kAes256GcmTagBytes, tag.data()) != 1) {
    return std::nullopt;
  }
  int tail = 0;
  if (EVP_DecryptFinal_ex(ctx, o + n, &tail) != 1) return std::nullopt;
  return out;
}

std::string Aes256GcmSeal(std::string_view key, std::string_view nonce, std::string_view aad,
                          std::string_view plaintext) {
  return Aes256GcmKey(key).Seal(nonce, aad, plaintext);
}

std::optional<std::string> Aes256GcmOpen(std::string_view key, std::string_view nonce,
                                         std::string_view aad, std::string_view sealed) {
  if (key.size() != kAes256GcmKeyBytes) return std::nullopt;
  return Aes256GcmKey(key).Open(nonce, aad, sealed);
}

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
