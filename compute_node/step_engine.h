// Executes step plans on a compute node: the core behind the ComputeNode gRPC service and
// the in-process executor of tests.
//
// For each plan: apply request setups and releases (the per-request sampling cache is
// rebuilt from plans, never kept elsewhere), hand slot assignments and rows to the
// attention backend, run the forward pass, and sample every target from the logits of the
// last row of its chunk. Penalty counts come from the rows themselves: prompt rows count as
// prompt tokens, later rows as outputs, so a recomputed request rebuilds them exactly.
//
// A one-token chunk may name its token as kLastSampledToken (common/protocol/step.h): the
// engine substitutes the token it sampled last for that sequence, if that token belongs at
// the chunk's position, and refuses the plan otherwise.
//
// A plan that cannot run (unknown request, token outside the vocabulary, no last sampled
// token for the position, position beyond the context, too many rows, a backend error)
// produces a StepResult with `status` set; the engine stays usable.
//
// Two batches in flight (Lamina's n = 2, "--pipelining two"): an engine built with two
// attention backends has two lanes, each with its own batch buffers. Begin/Advance/Finish
// run a plan on a lane one stage at a time: Begin ends with layer 0's attention sent, each
// Advance waits for the layer's attention, runs the rest of the layer and the next layer's
// projections, and sends that layer's attention. Alternating Advance between two lanes on
// one thread runs one batch's GEMMs while the other's attention is away
// (compute_node/step_pipeline.h). Plans on different lanes never share a sequence.
//
// Structured output (structured_output.h): a setup with a grammar gives the sequence a
// matcher that every later token of it feeds; each draw is masked to the tokens the grammar
// allows. A sequence whose grammar cannot be compiled, or whose tokens stop following it,
// fails alone (StepResult::failed); the rest of the step goes on.
//
// Rotational pipelining (rotation.h): BeginRotated/AdvanceRotated run this replica's share
// of a plan, the slices k (k = 0 embeds and projects layer 0; 0 < k < L runs layer k-1's
// output projection and FFN and layer k's projections; k = L ends the last layer and
// samples) with (batch + k) mod R equal to this replica's index. Every slice hands the
// residual rows to the next slice's replica (context_exchange.h) and routes its layer's
// attention answers there; the replica of slice L samples, the others answer with no tokens.
// Every replica applies every plan's setups, releases and rows, so each holds the sampling
// state of every sequence and any of them can sample. A memory node that fails its share
// fails its rows alone here too: the context handed on names its pool, and the replicas
// after stop expecting its answers.
//
// Thread-safety: one thread at a time calls Execute and the lane methods.
#ifndef STRATA_COMPUTE_NODE_STEP_ENGINE_H_
#define STRATA_COMPUTE_NODE_STEP_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/time/time.h"
#include "common/base/trace.h"
#include "common/protocol/step.h"
#include "compute_node/attention_backend.h"
#include "compute_node/context_exchange.h"
#include "compute_node/model_runner.h"
#include "compute_node/sampler.h"
#include "compute_node/structured_output.h"

namespace strata {

struct StepEngineOptions {
  int64_t max_batch_rows = 2048;  // rows (tokens) per step
  int64_t max_positions = 4096;   // context length (RoPE table)
  // Records each lane's stages (track = lane): "step S begin", "wait L", "step S L",
  // "step S sample"; null: nothing is recorded. Must outlive the engine.
  TraceRecorder* trace = nullptr;
  // Structured output: the tokenizer's vocabulary as the grammar matcher sees it, and the
  // end tokens. Null: requests with a grammar fail with a clear error. Must outlive the
  // engine.
  const GrammarVocabulary* grammar_vocabulary = nullptr;
};

// The lane interface that the pipeline driver (step_pipeline.h) runs plans through.
class LaneEngine {
 public:
  virtual ~LaneEngine() = default;
  virtual int num_lanes() const = 0;
  // Starts `plan` on a free lane. A plan that cannot start, or has nothing to compute, is
  // answered at once (the lane stays free).
  virtual std::optional<StepResult> Begin(int lane, const StepPlan& plan) = 0;
  // Runs the lane's next stage; true once its forward pass is over (or failed).
  virtual bool Advance(int lane) = 0;
  // Samples and frees the lane.
  virtual StepResult Finish(int lane) = 0;
};

// A replica's place in the rotation of one plan (common/protocol/step.h, StepPlan::rotation).
struct RotationRole {
  int batch = 0;                      // batch slot
  int replica = 0;                    // this replica's index
  std::vector<std::string> replicas;  // each replica's context-exchange address
  ContextExchange* exchange = nullptr;
  absl::Duration handoff_timeout = absl::Seconds(10);  // for each slice's inputs
  int num_replicas() const { return static_cast<int>(replicas.size()); }
  int ReplicaOf(int slice) const { return (batch + slice) % num_replicas(); }
  // The context-exchange address of the replica that runs `slice`.
  const std::string& AddressOf(int slice) const { return replicas[ReplicaOf(slice)]; }
  uint64_t EndpointOf(int slice) const { return RotationEndpoint(AddressOf(slice), batch); }
};

class StepEngine : public LaneEngine {
 public:
  static constexpr size_t kMaxLanes = 16;
  // `runner` and `attention` must outlive the engine. One lane.
  StepEngine(const ModelRunner* runner, AttentionBackend* attention, StepEngineOptions options);
  // One lane per backend (at most two: see above).
  StepEngine(const ModelRunner* runner, std::vector<AttentionBackend*> lanes,
             StepEngineOptions options);
  ~StepEngine() override;

  // Runs a plan whole on lane 0.
  StepResult Execute(const StepPlan& plan);

  int num_lanes() const override { return static_cast<int>(lanes_.size()); }
  std::optional<StepResult> Begin(int lane, const StepPlan& plan) override;
  bool Advance(int lane) override;
  StepResult Finish(int lane) override;
  bool lane_busy(int lane) const;

  // Rotational pipelining: starts this replica's share of `plan` on a free lane, whose
  // backend must route (RemoteAttention with an endpoint). Answered at once when the plan
  // cannot start, or when none of its slices is this replica's.
  std::optional<StepResult> BeginRotated(int lane, const StepPlan& plan, const RotationRole& role);
  // Whether the lane's next slice has its inputs (the context and the attention answers,
  // but those of pools the context names as failed), or their deadline has passed.
  bool RotationReady(int lane) const;
  absl::Time RotationDeadline(int lane) const;
  // Runs the lane's next slice; true once this replica's share is over (or failed): then
  // Finish samples (on the replica of the last slice) and frees the lane.
  bool AdvanceRotated(int lane);

  size_t num_cached_requests() const { return requests_.size(); }
  // Drops every cached request (another scheduler's sequences): only with no lane busy.
  void ForgetRequests() { requests_.clear(); }
  uint64_t steps_executed() const { return steps_executed_; }
  // Plans begun while another lane's plan was running: the steps that overlapped.
  uint64_t overlapped_steps() const { return overlapped_steps_; }

 private:
  struct Lane;
  // Applies the plan's setups and releases and lays out its rows on the lane; a result when
  // the plan cannot run.
  std::optional<StepResult> Prepare(Lane& lane, const StepPlan& plan);
  // The forward pass of the lane's plan up to layer 0's attention sent.
  void StartForward(Lane& lane);
  // Rotational: after slice k's work, hands the context and layer k's answers on to the
  // replica of slice k + 1, then moves to this replica's next slice.
  void HandOff(Lane& lane, int k);
  // Fails the lane's plan, with what the attention side says of the step.
  void EndForward(Lane& lane, absl::Status status);
  // A rotated lane that gives up, with `why`, tells the replica of the slice after the one
  // it was at (lane.next_slice): that replica would otherwise wait for the context until
  // its hand-off deadline, then the one after it, and so on around the rotation. Each
  // passes the failure on as it gives up in turn.
  void PassFailureOn(const Lane& lane, const absl::Status& why);

  struct RequestCache {
    SamplingParams sampling;
    int32_t prompt_len = 0;
    SequenceId parent;  // an n > 1 child's owner (its prompt's chunks sample for it)
    // Counts for penalties; the prompt's map is shared with n > 1 children.
    std::shared_ptr<std::unordered_map<int32_t, int32_t>> prompt_counts;
    std::unordered_map<int32_t, int32_t> output_counts;
    // The token this node sampled last for the sequence, and the position it belongs at;
    // what a kLastSampledToken row stands for.
    int32_t last_sampled = -1;
    int64_t last_sampled_position = -1;
    // Structured output (null: none), or why the sequence cannot follow its grammar.
    std::shared_ptr<SequenceGrammar> grammar;
    absl::Status grammar_error;
  };

  const ModelRunner* runner_;
  StepEngineOptions options_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::unordered_map<SequenceId, RequestCache> requests_;
  GrammarCache grammars_;
  uint64_t steps_executed_ = 0;
  uint64_t overlapped_steps_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_STEP_ENGINE_H_
