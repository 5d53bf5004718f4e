// A Hugging Face tokenizer, interpreted from tokenizer.json (and tokenizer_config.json).
//
// Encoding: the text is split on added tokens (special or not; lstrip, rstrip and
// single_word honoured), each remaining piece is normalized, pre-tokenized into words, and
// each word goes through the BPE model; the post-processor then adds special tokens (BOS).
// Decoding maps ids to token strings, drops special tokens on request, and runs the
// decoder chain; the result is always valid UTF-8 (invalid byte sequences become U+FFFD).
//
// Supported components are listed in normalizer.h, pre_tokenizer.h, decoder.h and
// bpe_model.h; a component of any other type is an error at load, naming the type.
// Added tokens are matched on the raw text, including those marked "normalized" (their
// normalized form equals the raw one for the supported families).
//
// Thread-safety: a loaded Tokenizer is safe to use from any number of threads.
#ifndef STRATA_COMMON_TOKENIZER_TOKENIZER_H_
#define STRATA_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace strata {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
};

class Tokenizer {
 public:
  // Reads <dir>/tokenizer.json and, if present, <dir>/tokenizer_config.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& dir);
  // `config_json` may be empty.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                             std::string_view config_json);
  ~Tokenizer();

  // `text` may hold invalid UTF-8; it is sanitised first. With add_special_tokens the
  // post-processor's template applies (e.g. BOS); with parse_special false, special tokens
  // written in the text are tokenized as plain text.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = true,
                              bool parse_special = true) const;

  // Valid UTF-8. Unknown ids are skipped. With clean_up, transformers' spacing clean-up
  // (" ." -> ".", " n't" -> "n't", ...) runs when tokenizer_config asks for it.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = true,
                     bool clean_up = false) const;
  // The decoder chain's raw output, before UTF-8 sanitising (for streaming).
  std::string DecodeBytes(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // The text one token adds in the middle of a text (for logprobs): unlike Decode({id}),
  // it keeps the leading space that SentencePiece-style decoders strip at the start of a
  // text. Raw decoder bytes: a token holding part of a UTF-8 character gives that part.
  std::string TokenText(int32_t id) const;

  // One past the largest token id (model vocabulary and added tokens).
  int32_t vocab_size() const { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::string IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // From tokenizer_config.json (empty / -1 when absent).
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  int32_t bos_token_id() const { return bos_id_; }
  int32_t eos_token_id() const { return eos_id_; }
  const std::string& chat_template() const { return chat_template_; }
  bool clean_up_tokenization_spaces() const { return clean_up_tokenization_spaces_; }

 private:
  Tokenizer() = default;
  struct PostStep;
  void EncodeText(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void PostProcess(std::vector<int32_t>& ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<PostStep> post_steps_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::vector<std::vector<size_t>> added_by_first_byte_;  // [byte] -> indices into added_
  int32_t vocab_size_ = 0;

  std::string bos_token_, eos_token_, chat_template_;
  int32_t bos_id_ = -1, eos_id_ = -1;
  bool clean_up_tokenization_spaces_ = false;
};

// transformers' clean_up_tokenization: removes the space before punctuation and English
// contractions.
std::string CleanUpTokenizationSpaces(std::string text);

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_TOKENIZER_H_
