// The BPE model of tokenizer.json: vocabulary, ranked merges, byte fallback (SentencePiece
// style, "<0xAB>" tokens), unk handling and ignore_merges (Llama 3). Merges apply lowest
// rank first, leftmost first among equal ranks, as Hugging Face tokenizers does.
//
// Thread-safety: Tokenize may run concurrently (the word cache is locked).
#ifndef STRATA_COMMON_TOKENIZER_BPE_MODEL_H_
#define STRATA_COMMON_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

class BpeModel {
 public:
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word.
  void Tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // Empty for ids without a token.
  const std::string& IdToToken(int32_t id) const;
  // One past the largest id.
  int32_t size() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t num_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  void TokenizeUncached(std::string_view word, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> merge
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  std::array<int32_t, 256> byte_ids_{};
  bool have_byte_tokens_ = false;

  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_BPE_MODEL_H_
