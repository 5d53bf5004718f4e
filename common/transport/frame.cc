#include "common/transport/frame.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata::transport {
namespace {

// The checksum keeps 8 lanes of 64 bits over 64-byte blocks. The 8-byte word w of lane j
// in block b adds lo32(x) * hi32(x) + w, where x = w ^ (kKeys[j] + b * kStep): every bit of
// the input reaches the sum through a multiply as well as directly, and the key changes
// with the block, so moved blocks change the sum. The lanes are mixed at the end with the
// total length.
constexpr uint64_t kKeys[8] = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                               0xD6E8FEB86659FD93ull, 0xFF51AFD7ED558CCDull, 0xC4CEB9FE1A85EC53ull,
                               0x27D4EB2F165667C5ull, 0x94D049BB133111EBull};

constexpr uint64_t kStep = 0x9FB21C651E98DF25ull;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

// `keys` holds the current key of each lane and advances by kStep per block.
void BlocksScalar(uint64_t* acc, uint64_t* keys, const uint8_t* p, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b, p += 64) {
    for (int j = 0; j < 8; ++j) {
      uint64_t w;
      std::memcpy(&w, p + 8 * j, 8);
      const uint64_t x = w ^ keys[j];
      acc[j] += (x & 0xFFFFFFFFull) * (x >> 32) + w;
      keys[j] += kStep;
    }
  }
}

__attribute__((target("avx2"))) void BlocksAvx2(uint64_t* acc, uint64_t* keys, const uint8_t* p,
                                                size_t blocks) {
  __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc));
  __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + 4));
  __m256i k0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys));
  __m256i k1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + 4));
  const __m256i step = _mm256_set1_epi64x(static_cast<long long>(kStep));
  for (size_t b = 0; b < blocks; ++b, p += 64) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
    const __m256i x0 = _mm256_xor_si256(w0, k0);
    const __m256i x1 = _mm256_xor_si256(w1, k1);
    const __m256i m0 = _mm256_mul_epu32(x0, _mm256_srli_epi64(x0, 32));
    const __m256i m1 = _mm256_mul_epu32(x1, _mm256_srli_epi64(x1, 32));
    a0 = _mm256_add_epi64(a0, _mm256_add_epi64(m0, w0));
    a1 = _mm256_add_epi64(a1, _mm256_add_epi64(m1, w1));
    k0 = _mm256_add_epi64(k0, step);
    k1 = _mm256_add_epi64(k1, step);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), a0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + 4), a1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(keys), k0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(keys + 4), k1);
}

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

}  // namespace

uint64_t PayloadChecksum(std::span<const std::span<const uint8_t>> parts) {
  uint64_t acc[8], keys[8];
  std::memcpy(acc, kKeys, sizeof(acc));
  std::memcpy(keys, kKeys, sizeof(keys));
  auto blocks = HaveAvx2() ? &BlocksAvx2 : &BlocksScalar;
  uint8_t carry[64];
  size_t carried = 0;
  uint64_t total = 0;
  for (const auto& part : parts) {
    const uint8_t* p = part.data();
    size_t n = part.size();
    total += n;
    if (carried > 0) {
      const size_t take = std::min(n, 64 - carried);
      std::memcpy(carry + carried, p, take);
      carried += take;
      p += take;
      n -= take;
      if (carried < 64) continue;
      blocks(acc, keys, carry, 1);
      carried = 0;
    }
    blocks(acc, keys, p, n / 64);
    p += n / 64 * 64;
    n %= 64;
    std::memcpy(carry, p, n);
    carried = n;
  }
  if (carried > 0) {
    std::memset(carry + carried, 0, 64 - carried);
    blocks(acc, keys, carry, 1);
  }
  uint64_t h = Mix(total ^ 0x5354524C5354524Cull);
  for (int j = 0; j < 8; ++j) h = Mix(h ^ acc[j]) + kKeys[j];
  return h;
}

absl::Status ParseFrameHeader(std::span<const uint8_t> bytes, FrameHeader* out) {
  if (bytes.size() != sizeof(FrameHeader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header of ", bytes.size(), " bytes, want ", sizeof(FrameHeader)));
  }
  std::memcpy(out, bytes.data(), sizeof(FrameHeader));
  if (out->magic != kFrameMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame with a wrong magic number 0x", absl::Hex(out->magic)));
  }
  if (out->version != kFrameVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("frame of version ", out->version, "; this node speaks ", kFrameVersion));
  }
  if (out->kind < static_cast<uint16_t>(FrameKind::kStep) ||
      out->kind > static_cast<uint16_t>(FrameKind::kResult)) {
    return absl::InvalidArgumentError(absl::StrCat("frame of unknown kind ", out->kind));
  }
  return absl::OkStatus();
}

absl::Status CheckFramePayload(const FrameHeader& header, std::span<const uint8_t> payload,
                               bool verify) {
  if (payload.size() != header.payload_bytes) {
    return absl::DataLossError(
        absl::StrCat(FrameKindName(header.kind), " frame of step ", header.step_id, " has ",
                     payload.size(), " payload bytes; its header says ", header.payload_bytes));
  }
  if (verify && PayloadChecksum(payload) != header.checksum) {
    return absl::DataLossError(absl::StrCat("checksum mismatch in ", FrameKindName(header.kind),
                                            " frame of step ", header.step_id, ", layer ",
                                            header.layer, ", mini-batch ", header.minibatch));
  }
  return absl::OkStatus();
}

std::string FrameKindName(uint16_t kind) {
  switch (static_cast<FrameKind>(kind)) {
    case FrameKind::kStep:
      return "step";
    case FrameKind::kLayer:
      return "layer";
    case FrameKind::kLayerResult:
      return "layer-result";
    case FrameKind::kError:
      return "error";
    case FrameKind::kHello:
      return "hello";
    case FrameKind::kContext:
      return "context";
    case FrameKind::kPlan:
      return "plan";
    case FrameKind::kResult:
      return "result";
  }
  return absl::StrCat("kind-", kind);
}

FrameHeader ErrorFrameHeader(const FrameHeader& about, const absl::Status& status,
                             std::string* text) {
  FrameHeader answer = about;
  answer.magic = kFrameMagic;
  answer.version = kFrameVersion;
  answer.kind = static_cast<uint16_t>(FrameKind::kError);
  answer.flags = static_cast<uint16_t>(status.code());
  *text = std::string(status.message().substr(0, kMaxErrorText));
  const std::span<const uint8_t> body(reinterpret_cast<const uint8_t*>(text->data()), text->size());
  answer.payload_bytes = body.size();
  answer.checksum = PayloadChecksum(body);
  return answer;
}

absl::Status ErrorFrameStatus(const FrameHeader& header, std::span<const uint8_t> payload) {
  const std::string text(reinterpret_cast<const char*>(payload.data()),
                         std::min<size_t>(payload.size(), kMaxErrorText));
  const int code = header.flags;
  const bool is_error = code > static_cast<int>(absl::StatusCode::kOk) &&
                        code <= static_cast<int>(absl::StatusCode::kUnauthenticated);
  return absl::Status(is_error ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kInternal,
                      text);
}

}  // namespace strata::transport
