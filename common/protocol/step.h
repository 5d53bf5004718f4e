// One step of one batch, as the scheduler plans it and a compute node executes it. Plain
// structs; the gRPC edge converts them to and from proto/control.proto (step_proto.h).
//
// A plan carries diffs (docs/architecture.md): a request's fixed data (sampling parameters,
// prompt length) once in `setups`; its KV slot extents as they grow in `assignments`; the
// rows to compute in `chunks`; and, once it is done, a `release` that drops its caches on
// the compute node and its slot table on the memory node that held it.
#ifndef STRATA_COMMON_PROTOCOL_STEP_H_
#define STRATA_COMMON_PROTOCOL_STEP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/protocol/sampling_params.h"
#include "common/protocol/step_plan.h"

namespace strata {

struct RequestSetup {
  SequenceId request_id;
  SamplingParams sampling;
  int32_t prompt_len = 0;
  SequenceId parent_request_id;  // n > 1: share the parent's prompt history (0: none)
  // Tokens processed on another compute node before this setup (penalty counts, and the
  // grammar's state).
  std::vector<int32_t> history;
  // Structured output: GBNF that the sampled tokens must follow (empty: none).
  std::string grammar;
};

struct SampleTarget {
  SequenceId request_id;
  uint32_t sample_index = 0;
  int64_t output_position = 0;
  std::vector<int32_t> banned_tokens;
};

// In a one-token chunk, in place of a token id: the token this compute node sampled last
// for the sequence, which must be the token of `start_position` (asynchronous scheduling:
// step s+1 can be sent before step s's token is back). The node refuses it where it has no
// such token (the step that would have sampled it failed, or ran elsewhere).
inline constexpr int32_t kLastSampledToken = -1;

struct SequenceChunk {
  SequenceId request_id;
  PoolIndex pool;
  int32_t start_position = 0;
  std::vector<int32_t> tokens;        // ids, or one kLastSampledToken
  std::vector<SampleTarget> samples;  // drawn from the last row's logits
  // Non-zero: the sequence's earlier KV is still being loaded from disk under this ticket
  // (KvMove::ticket); attention of each layer waits for that layer of it.
  uint64_t load_ticket = 0;
};

// Rotational pipelining: a replica's place in a plan's rotation (none: `replicas` empty).
// Slice k of the layers runs on replicas[(batch + k) % replicas.size()].
struct StepRotation {
  int32_t batch = 0;
  int32_t replica = 0;
  std::vector<std::string> replicas;  // context-exchange addresses
  bool active() const { return !replicas.empty(); }
};

struct StepPlan {
  uint64_t step_id = 0;
  uint64_t epoch = 0;
  StepRotation rotation;
  std::vector<RequestSetup> setups;
  std::vector<TableRelease> releases;
  std::vector<SlotAssignment> assignments;
  std::vector<SequenceChunk> chunks;

  int64_t num_rows() const {
    int64_t n = 0;
    for (const SequenceChunk& c : chunks) n += static_cast<int64_t>(c.tokens.size());
    return n;
  }
};

struct SampledToken {
  SequenceId request_id;
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

struct StepTiming {
  uint64_t total_us = 0;
  uint64_t gemm_us = 0;
  uint64_t attention_us = 0;
  uint64_t sample_us = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t rows = 0;
  // For a plan the node started with no other plan running, after an earlier one: how long
  // it was queued before the node was free for it (positive), or how long the node, free,
  // waited for it (negative). Unset otherwise. The scheduler plans ahead by it.
  std::optional<int64_t> plan_slack_us;
};

struct StepResult {
  uint64_t step_id = 0;
  std::vector<SampledToken> tokens;
  // Sequences that failed while the rest of the step went on (a memory node died).
  std::vector<std::pair<SequenceId, absl::Status>> failed;
  std::vector<PoolIndex> dead_pools;
  StepTiming timing;
  absl::Status status;  // not OK: the whole step failed
  // Set on the scheduler's side (never sent): the step failed because the compute node could
  // not be reached (its connection broke or was refused), not because of the plan.
  bool node_unreachable = false;
};

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_STEP_H_
