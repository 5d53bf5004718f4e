// What the frontends hand the scheduler, and what they get back.
#ifndef STRATA_SERVER_REQUEST_H_
#define STRATA_SERVER_REQUEST_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/protocol/sampling_params.h"

namespace strata {

enum class FinishReason { kNone, kStop, kLength, kAbort, kTimeout, kError };

// OpenAI's finish_reason spelling ("stop", "length"; "abort" and "error" as vLLM reports).
const char* FinishReasonName(FinishReason reason);

struct GenerateRequest {
  std::string external_id;  // the API id ("cmpl-..."), for logs
  std::vector<int32_t> prompt_tokens;
  SamplingParams sampling;
  bool has_seed = false;  // else the scheduler draws one, so that preemption is exact
  int n = 1;
  int max_tokens = 16;
  int min_tokens = 0;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  int priority = 0;  // lower runs first under the priority policy (vLLM's convention)
  // Structured output: GBNF every output must follow (common/grammar); empty for none.
  std::string grammar;
  absl::Duration timeout = absl::ZeroDuration();  // zero: the scheduler's default
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

// Progress of one of a request's n sequences since the previous update.
struct SequenceUpdate {
  uint32_t index = 0;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;  // parallel to tokens when logprobs were asked for
  std::string text;                    // valid UTF-8, never part of a stop string
  FinishReason finish = FinishReason::kNone;
  std::string stop_reason;  // the stop string or token that ended it
};

struct RequestUpdate {
  uint64_t request_id = 0;
  std::vector<SequenceUpdate> sequences;
  bool finished = false;  // every sequence finished; no update follows
  absl::Status error;     // set when the request failed (finish reason kError)
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
};

// Called on the scheduler thread; must not block (post the work elsewhere).
using UpdateCallback = std::function<void(const RequestUpdate&)>;

}  // namespace strata

#endif  // STRATA_SERVER_REQUEST_H_
