// The KV cache of one node: for every layer, K and V arrays of
// [num_slots][num_kv_heads][head_dim] elements (bf16 or f16), addressed by token slot.
//
// The store never allocates slots: the scheduler owns the slot ledger (docs/architecture.md)
// and tells this node where each token goes. The memory is reserved and pre-faulted at
// construction (first touch costs ~3 s/GiB here), with transparent huge pages requested.
//
// Thread-safety: concurrent writes to distinct slots and reads of slots nobody writes are
// safe; the owner (AttentionEngine) serialises steps.
#ifndef STRATA_MEMORY_NODE_KV_STORE_H_
#define STRATA_MEMORY_NODE_KV_STORE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/cpu/attention.h"

namespace strata {

struct KvStoreConfig {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  kernels::KvDType dtype = kernels::KvDType::kBF16;
  int64_t num_slots = 0;
  bool prefault = true;  // touch every page at construction

  // Bytes of K plus V for one token across all layers.
  int64_t bytes_per_token() const { return 2LL * num_layers * num_kv_heads * head_dim * 2; }
};

// The bytes a store of `config` takes, or INVALID_ARGUMENT for a shape or slot count no
// store can have: non-positive, past 65536 layers, KV heads or head dim, past 2^31 slots
// (slots are int32 in plans), or past 2^50 bytes (where the product would also wrap).
absl::StatusOr<size_t> KvStoreBytes(const KvStoreConfig& config);

class KvStore {
 public:
  static absl::StatusOr<std::unique_ptr<KvStore>> Create(const KvStoreConfig& config);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  const KvStoreConfig& config() const { return config_; }
  int64_t num_slots() const { return config_.num_slots; }
  size_t total_bytes() const { return bytes_; }
  // Elements per slot per layer in one of K or V: num_kv_heads * head_dim.
  int64_t row_elements() const { return row_elements_; }

  uint16_t* k(int layer) { return LayerBase(layer, 0); }
  uint16_t* v(int layer) { return LayerBase(layer, 1); }
  const uint16_t* k(int layer) const { return const_cast<KvStore*>(this)->LayerBase(layer, 0); }
  const uint16_t* v(int layer) const { return const_cast<KvStore*>(this)->LayerBase(layer, 1); }

  // Copies `n` rows of K and V (each [n][row_elements]) into slots[i]. Slots must be in
  // range (CHECKed: callers validate plans from the network first).
  void WriteRows(int layer, int n, const int32_t* slots, const uint16_t* k_rows,
                 const uint16_t* v_rows);

 private:
  KvStore() = default;
  uint16_t* LayerBase(int layer, int kv) {
    return base_ + (static_cast<size_t>(layer) * 2 + kv) * config_.num_slots * row_elements_;
  }

  KvStoreConfig config_;
  int64_t row_elements_ = 0;
  uint16_t* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace strata

#endif  // STRATA_MEMORY_NODE_KV_STORE_H_
