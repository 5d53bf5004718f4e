#include "server/output_processor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kTimeout:
      return "timeout";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

OutputProcessor::OutputProcessor(const Tokenizer* tokenizer, const std::vector<int32_t>& prompt,
                                 StopConditions stop)
    : stop_(std::move(stop)) {
  all_stop_tokens_ = stop_.eos_tokens;
  all_stop_tokens_.insert(all_stop_tokens_.end(), stop_.stop_token_ids.begin(),
                          stop_.stop_token_ids.end());
  if (tokenizer != nullptr) {
    detokenizer_ =
        std::make_unique<IncrementalDetokenizer>(tokenizer, prompt, stop_.skip_special_tokens);
  }
}

const std::vector<int32_t>& OutputProcessor::banned_tokens_at(int64_t position) const {
  return position < stop_.min_tokens ? all_stop_tokens_ : no_bans_;
}

// Returns the held text that can no longer become part of a stop string.
std::string OutputProcessor::TakeEmittable(bool final) {
  size_t keep = 0;
  if (!final) {
    for (const std::string& s : stop_.stop_strings) {
      if (s.empty()) continue;
      // Longest proper prefix of s that is a suffix of held_.
      for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
        if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
          keep = len;
          break;
        }
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

OutputProcessor::Delta OutputProcessor::Push(int32_t token) {
  Delta delta;
  if (finished_) return delta;
  ++num_tokens_;
  const bool stop_token =
      std::find(all_stop_tokens_.begin(), all_stop_tokens_.end(), token) != all_stop_tokens_.end();
  if (stop_token && num_tokens_ > stop_.min_tokens) {
    // The stop token's own text is not part of the output.
    if (detokenizer_) held_ += detokenizer_->Flush();
    delta.text = TakeEmittable(/*final=*/true);
    delta.finish = FinishReason::kStop;
    const bool eos = std::find(stop_.eos_tokens.begin(), stop_.eos_tokens.end(), token) !=
                     stop_.eos_tokens.end();
    if (!eos) delta.stop_reason = std::to_string(token);
    finished_ = true;
    return delta;
  }
  if (detokenizer_) {
    held_ += detokenizer_->Push(token);
  } else {
    // A model without a tokenizer: the text is the ids, as vLLM writes tokens for
    // return_tokens_as_token_ids, rather than nothing.
    absl::StrAppend(&held_, "token_id:", token);
  }
  // A stop string anywhere in the held text ends the sequence there.
  size_t first = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& s : stop_.stop_strings) {
    if (s.empty()) continue;
    const size_t at = held_.find(s);
    if (at != std::string::npos && at < first) {
      first = at;
      matched = &s;
    }
  }
  if (matched != nullptr) {
    held_.resize(first + (stop_.include_stop_str_in_output ? matched->size() : 0));
    delta.text = TakeEmittable(/*final=*/true);
    delta.finish = FinishReason::kStop;
    delta.stop_reason = *matched;
    finished_ = true;
    return delta;
  }
  if (num_tokens_ >= stop_.max_tokens) {
    if (detokenizer_) held_ += detokenizer_->Flush();
    delta.text = TakeEmittable(/*final=*/true);
    delta.finish = FinishReason::kLength;
    finished_ = true;
    return delta;
  }
  delta.text = TakeEmittable(/*final=*/false);
  return delta;
}

std::string OutputProcessor::Flush() {
  if (finished_) return "";
  finished_ = true;
  if (detokenizer_) held_ += detokenizer_->Flush();
  return TakeEmittable(/*final=*/true);
}

}  // namespace strata
