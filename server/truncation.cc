#include "server/truncation.h"

#include <cmath>

namespace strata {

bool AbslParseFlag(absl::string_view text, ContextOverflow* out, std::string* error) {
  if (text == "error") {
    *out = ContextOverflow::kError;
  } else if (text == "truncate") {
    *out = ContextOverflow::kTruncate;
  } else {
    *error = "expected 'error' or 'truncate'";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(ContextOverflow c) {
  return c == ContextOverflow::kTruncate ? "truncate" : "error";
}

std::optional<Truncation> PlanTruncation(int64_t prompt_len, int64_t max_tokens,
                                         int64_t max_model_len, int64_t keep_tokens,
                                         int block_tokens) {
  const int64_t b = block_tokens;
  const int64_t over = prompt_len + max_tokens - max_model_len;
  if (over <= 0 || b <= 0) return std::nullopt;
  Truncation t;
  t.keep_first = (std::max<int64_t>(keep_tokens, 0) + b - 1) / b * b;
  t.dropped = (over + b - 1) / b * b;
  // At least one token after the dropped middle (the newest: its logits give the output).
  if (t.keep_first + t.dropped >= prompt_len) return std::nullopt;
  return t;
}

std::vector<int32_t> Truncate(const std::vector<int32_t>& tokens, const Truncation& t) {
  std::vector<int32_t> out(tokens.begin(), tokens.begin() + t.keep_first);
  out.insert(out.end(), tokens.begin() + t.keep_first + t.dropped, tokens.end());
  return out;
}

void ShiftAngles(const std::vector<double>& inv_freq, int64_t shift, std::vector<float>* cos,
                 std::vector<float>* sin) {
  cos->resize(inv_freq.size());
  sin->resize(inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double angle = static_cast<double>(shift) * inv_freq[i];
    (*cos)[i] = static_cast<float>(std::cos(angle));
    (*sin)[i] = static_cast<float>(std::sin(angle));
  }
}

}  // namespace strata
