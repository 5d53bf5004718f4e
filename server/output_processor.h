// Turns the tokens a sequence samples into the text a client sees, and decides when the
// sequence stops: EOS and stop token ids (not before min_tokens), max_tokens, and stop
// strings. Text that could be the start of a stop string is held back until it is decided,
// so a stop string is never streamed out; text is valid UTF-8 and never splits a character.
//
// Not thread-safe: one per sequence, on the scheduler thread.
#ifndef STRATA_SERVER_OUTPUT_PROCESSOR_H_
#define STRATA_SERVER_OUTPUT_PROCESSOR_H_

#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "server/request.h"

namespace strata {

struct StopConditions {
  std::vector<int32_t> eos_tokens;      // unless ignore_eos; not reported as a stop reason
  std::vector<int32_t> stop_token_ids;  // the request's; reported as the stop reason
  std::vector<std::string> stop_strings;
  bool include_stop_str_in_output = false;
  int max_tokens = 16;
  int min_tokens = 0;
  bool skip_special_tokens = true;
};

class OutputProcessor {
 public:
  // `tokenizer` may be null (no text, only ids); `prompt` gives the detokenizer context.
  OutputProcessor(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt,
                  StopConditions stop);

  struct Delta {
    std::string text;
    FinishReason finish = FinishReason::kNone;
    std::string stop_reason;
  };
  // Consumes the next sampled token.
  Delta Push(int32_t token);
  // Ends the sequence early (abort, timeout): returns the text still held back.
  std::string Flush();

  int num_tokens() const { return num_tokens_; }
  // Tokens that may not be sampled next (stop tokens before min_tokens).
  const std::vector<int32_t>& banned_tokens() const { return banned_tokens_at(num_tokens_); }
  // The same for the draw of output `position` (0-based), which may lie past the tokens
  // pushed so far: asynchronous scheduling plans a draw before the previous one is known.
  const std::vector<int32_t>& banned_tokens_at(int64_t position) const;

 private:
  std::string TakeEmittable(bool final);

  std::unique_ptr<IncrementalDetokenizer> detokenizer_;
  StopConditions stop_;
  std::string held_;  // decoded text not yet emitted
  int num_tokens_ = 0;
  bool finished_ = false;
  std::vector<int32_t> no_bans_;
  std::vector<int32_t> all_stop_tokens_;
};

}  // namespace strata

#endif  // STRATA_SERVER_OUTPUT_PROCESSOR_H_
