// Streaming detokenization: turns generated token ids into text deltas as they arrive.
//
// Each delta is valid UTF-8 and never splits a character: bytes that may still be completed
// by a later token are held back, invalid bytes are emitted as U+FFFD. Context-sensitive
// decoders (a SentencePiece leading space, a Strip) are handled by decoding a short window
// that starts a few tokens back, like vLLM's incremental detokenizer, so the concatenated
// deltas equal the decode of the whole output.
//
// Not thread-safe: one instance per output sequence.
#ifndef STRATA_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define STRATA_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace strata {

class IncrementalDetokenizer {
 public:
  // `context`: the prompt's ids (its last few give the decoders their context).
  IncrementalDetokenizer(const Tokenizer* tokenizer, const std::vector<int32_t>& context,
                         bool skip_special_tokens);

  // Adds a generated token and returns the text that became final (maybe empty).
  std::string Push(int32_t token);
  // Returns everything still held back; incomplete bytes become U+FFFD.
  std::string Flush();

  // All text emitted so far.
  const std::string& text() const { return text_; }

 private:
  std::string NewBytes() const;

  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // window start
  size_t read_offset_ = 0;    // tokens before this are fully emitted
  size_t emitted_ = 0;        // bytes of the current window's new text already emitted
  std::string text_;
};

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
