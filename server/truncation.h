// Context overflow by truncation (AttentionStore §3.4), behind --context_overflow=truncate:
// when a conversation's history plus the new turn and its output outgrow the context
// window, the prompt keeps its first tokens and its most recent ones and drops the middle.
//
// Both the kept start and the dropped middle are whole prefix-cache blocks, so that:
//   - the kept start is the prefix of the untruncated conversation (a prefix-cache hit);
//   - the kept tail's blocks are blocks the conversation's earlier turns cached (at
//     positions `dropped` later, or fewer where an earlier turn was truncated too). The
//     scheduler copies them to their new positions instead of recomputing them: K was
//     stored with RoPE applied, so it is re-rotated by the position shift (KvShift,
//     kernels/cpu/rope_shift.h); V is copied as is.
//
// The result cannot equal a fresh prefill of the truncated prompt: in layers past the first,
// a kept token's K and V were computed attending to the dropped tokens. docs/architecture.md
// says what to expect; docs/benchmarks.md measures the distance.
#ifndef STRATA_SERVER_TRUNCATION_H_
#define STRATA_SERVER_TRUNCATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace strata {

enum class ContextOverflow { kError, kTruncate };
bool AbslParseFlag(absl::string_view text, ContextOverflow* out, std::string* error);
std::string AbslUnparseFlag(ContextOverflow c);

struct Truncation {
  int64_t keep_first = 0;  // tokens kept at the start
  int64_t dropped = 0;     // tokens dropped right after them
};

// How a prompt of `prompt_len` tokens with room for `max_tokens` more fits in
// `max_model_len`: keep at least `keep_tokens` at the start (rounded up to whole blocks of
// `block_tokens`) and drop the fewest whole blocks after them that make it fit. nullopt if it
// cannot fit that way (the output alone leaves no room for the kept start and one more
// token). Only for prompts that overflow: prompt_len + max_tokens > max_model_len.
std::optional<Truncation> PlanTruncation(int64_t prompt_len, int64_t max_tokens,
                                         int64_t max_model_len, int64_t keep_tokens,
                                         int block_tokens);

// The truncated prompt: tokens [0, keep_first) and [keep_first + dropped, end).
std::vector<int32_t> Truncate(const std::vector<int32_t>& tokens, const Truncation& t);

// cos and sin of shift * inv_freq[i], the rotation that moves a RoPE'd key by `shift`
// positions.
void ShiftAngles(const std::vector<double>& inv_freq, int64_t shift, std::vector<float>* cos,
                 std::vector<float>* sin);

}  // namespace strata

#endif  // STRATA_SERVER_TRUNCATION_H_
