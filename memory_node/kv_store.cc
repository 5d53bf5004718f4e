#include "memory_node/kv_store.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/wait_policy.h"

namespace strata {

absl::StatusOr<size_t> KvStoreBytes(const KvStoreConfig& config) {
  if (config.num_layers <= 0 || config.num_kv_heads <= 0 || config.head_dim <= 0 ||
      config.num_slots <= 0) {
    return absl::InvalidArgumentError("KV store needs positive layers, heads, head_dim, slots");
  }
  constexpr int kMaxDim = 1 << 16;
  uint64_t bytes = 0;
  if (config.num_layers > kMaxDim || config.num_kv_heads > kMaxDim || config.head_dim > kMaxDim ||
      config.num_slots > std::numeric_limits<int32_t>::max() ||
      __builtin_mul_overflow(static_cast<uint64_t>(config.num_slots),
                             static_cast<uint64_t>(config.bytes_per_token()), &bytes) ||
      bytes > (uint64_t{1} << 50)) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.num_slots, " KV slots of ", config.bytes_per_token(),
        " bytes each: past 65536 layers, KV heads or head dim, 2^31 slots (slots are int32 in "
        "plans) or 2^50 bytes"));
  }
  return static_cast<size_t>(bytes);
}

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Create(const KvStoreConfig& config) {
  ASSIGN_OR_RETURN(const size_t bytes, KvStoreBytes(config));
  auto store = std::unique_ptr<KvStore>(new KvStore);
  store->config_ = config;
  store->row_elements_ = static_cast<int64_t>(config.num_kv_heads) * config.head_dim;
  store->bytes_ = bytes;
  void* p =
      mmap(nullptr, store->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", store->bytes_, " bytes of KV cache: ", strerror(errno)));
  }
  madvise(p, store->bytes_, MADV_HUGEPAGE);
  store->base_ = static_cast<uint16_t*>(p);
  if (config.prefault) {
    // Touch one byte per 4 KiB page, in parallel; zero pages stay zero. On a thread of its
    // own: the caller is a gRPC handler or a main thread, which must not keep an idle
    // OpenMP team beside the steps' (common/base/wait_policy.h).
    const int64_t pages = static_cast<int64_t>(store->bytes_ / 4096);
    volatile char* bytes = static_cast<volatile char*>(p);
    OnOwnOpenMpThread([pages, bytes] {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < pages; ++i) bytes[i * 4096] = 0;
    });
  }
  return store;
}

KvStore::~KvStore() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

void KvStore::WriteRows(int layer, int n, const int32_t* slots, const uint16_t* k_rows,
                        const uint16_t* v_rows) {
  uint16_t* k_base = k(layer);
  uint16_t* v_base = v(layer);
  const size_t row_bytes = static_cast<size_t>(row_elements_) * 2;
  for (int i = 0; i < n; ++i) {
    CHECK(slots[i] >= 0 && slots[i] < config_.num_slots) << "slot " << slots[i];
    std::memcpy(k_base + static_cast<size_t>(slots[i]) * row_elements_, k_rows + i * row_elements_,
                row_bytes);
    std::memcpy(v_base + static_cast<size_t>(slots[i]) * row_elements_, v_rows + i * row_elements_,
                row_bytes);
  }
}

}  // namespace strata
