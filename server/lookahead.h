// Scheduler-aware eviction's pick, shared by the DRAM ledger (KvPool) and the disk ledger
// (DiskLedger): in the ledger's eviction order, the first block that the look-ahead window
// (the blocks waiting requests will need) does not hold; the first block if it holds them
// all.
#ifndef STRATA_SERVER_LOOKAHEAD_H_
#define STRATA_SERVER_LOOKAHEAD_H_

#include <algorithm>
#include <cstdint>
#include <unordered_set>

namespace strata {

// [begin, end) in eviction order, not empty; `hash_of` gives an element's block hash.
template <class It, class HashOf>
It FirstOutsideLookahead(It begin, It end, const std::unordered_set<uint64_t>& lookahead,
                         HashOf hash_of) {
  if (lookahead.empty()) return begin;
  const It outside =
      std::find_if(begin, end, [&](const auto& e) { return !lookahead.count(hash_of(e)); });
  return outside != end ? outside : begin;
}

}  // namespace strata

#endif  // STRATA_SERVER_LOOKAHEAD_H_
