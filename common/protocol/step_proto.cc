#include "common/protocol/step_proto.h"

#include "absl/strings/str_cat.h"
#include "common/protocol/kv_shift_proto.h"

namespace strata {

void ToProto(const SamplingParams& p, control::SamplingParams* out) {
  out->set_temperature(p.temperature);
  out->set_top_p(p.top_p);
  out->set_top_k(p.top_k);
  out->set_min_p(p.min_p);
  out->set_presence_penalty(p.presence_penalty);
  out->set_frequency_penalty(p.frequency_penalty);
  out->set_repetition_penalty(p.repetition_penalty);
  for (const auto& [token, bias] : p.logit_bias) (*out->mutable_logit_bias())[token] = bias;
  out->set_seed(p.seed);
  out->set_num_logprobs(p.num_logprobs);
}

SamplingParams FromProto(const control::SamplingParams& in) {
  SamplingParams p;
  p.temperature = in.temperature();
  p.top_p = in.top_p();
  p.top_k = in.top_k();
  p.min_p = in.min_p();
  p.presence_penalty = in.presence_penalty();
  p.frequency_penalty = in.frequency_penalty();
  p.repetition_penalty = in.repetition_penalty();
  for (const auto& [token, bias] : in.logit_bias()) p.logit_bias.emplace_back(token, bias);
  std::sort(p.logit_bias.begin(), p.logit_bias.end());
  p.seed = in.seed();
  p.num_logprobs = in.num_logprobs();
  return p;
}

void ToProto(const absl::Status& status, control::Status* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
}

absl::Status FromProto(const control::Status& in) {
  if (in.code() == 0) return absl::OkStatus();
  const bool known =
      in.code() > 0 && in.code() <= static_cast<int>(absl::StatusCode::kUnauthenticated);
  return absl::Status(known ? static_cast<absl::StatusCode>(in.code()) : absl::StatusCode::kUnknown,
                      in.message());
}

void ToProto(const StepPlan& plan, control::StepPlan* out) {
  out->set_step_id(plan.step_id);
  out->set_epoch(plan.epoch);
  for (const RequestSetup& s : plan.setups) {
    auto* setup = out->add_setups();
    setup->set_request_id(s.request_id.value());
    ToProto(s.sampling, setup->mutable_sampling());
    setup->set_prompt_len(s.prompt_len);
    setup->set_parent_request_id(s.parent_request_id.value());
    setup->mutable_history()->Add(s.history.begin(), s.history.end());
    setup->set_grammar(s.grammar);
  }
  for (const TableRelease& r : plan.releases) {
    auto* release = out->add_releases();
    release->set_request_id(r.request_id.value());
    release->set_pool(r.pool.value());
  }
  for (const SlotAssignment& a : plan.assignments) {
    auto* assignment = out->add_assignments();
    assignment->set_request_id(a.request_id.value());
    assignment->set_pool(a.pool.value());
    assignment->set_start(a.start);
    assignment->mutable_slots()->Add(a.slots.begin(), a.slots.end());
    KvShiftsToProto(a.shifts, assignment->mutable_shifts());
  }
  if (plan.rotation.active()) {
    auto* rotation = out->mutable_rotation();
    rotation->set_batch(static_cast<uint32_t>(plan.rotation.batch));
    rotation->set_replica(static_cast<uint32_t>(plan.rotation.replica));
    for (const std::string& r : plan.rotation.replicas) rotation->add_replicas(r);
  }
  for (const SequenceChunk& c : plan.chunks) {
    auto* chunk = out->add_chunks();
    chunk->set_request_id(c.request_id.value());
    chunk->set_pool(c.pool.value());
    chunk->set_start_position(c.start_position);
    chunk->mutable_tokens()->Add(c.tokens.begin(), c.tokens.end());
    chunk->set_load_ticket(c.load_ticket);
    for (const SampleTarget& t : c.samples) {
      auto* target = chunk->add_samples();
      target->set_request_id(t.request_id.value());
      target->set_sample_index(t.sample_index);
      target->set_output_position(t.output_position);
      target->mutable_banned_tokens()->Add(t.banned_tokens.begin(), t.banned_tokens.end());
    }
  }
}

absl::StatusOr<StepPlan> FromProto(const control::StepPlan& in) {
  StepPlan plan;
  plan.step_id = in.step_id();
  plan.epoch = in.epoch();
  for (const auto& s : in.setups()) {
    if (s.prompt_len() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("setup of request ", s.request_id(), " has prompt_len ", s.prompt_len()));
    }
    RequestSetup setup;
    setup.request_id = SequenceId(s.request_id());
    setup.sampling = FromProto(s.sampling());
    setup.prompt_len = s.prompt_len();
    setup.parent_request_id = SequenceId(s.parent_request_id());
    setup.history.assign(s.history().begin(), s.history().end());
    setup.grammar = s.grammar();
    plan.setups.push_back(std::move(setup));
  }
  for (const auto& r : in.releases())
    plan.releases.push_back({SequenceId(r.request_id()), PoolIndex(r.pool())});
  for (const auto& a : in.assignments()) {
    if (a.start() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("assignment of request ", a.request_id(), " starts at ", a.start()));
    }
    SlotAssignment assignment{SequenceId(a.request_id()),
                              PoolIndex(a.pool()),
                              a.start(),
                              {a.slots().begin(), a.slots().end()},
                              {}};
    if (absl::Status s = KvShiftsFromProto(a.shifts(), &assignment.shifts); !s.ok()) return s;
    plan.assignments.push_back(std::move(assignment));
  }
  for (const auto& c : in.chunks()) {
    if (c.tokens().empty() || c.start_position() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk of request ", c.request_id(), " is empty or starts at ", c.start_position()));
    }
    SequenceChunk chunk;
    chunk.request_id = SequenceId(c.request_id());
    chunk.pool = PoolIndex(c.pool());
    chunk.start_position = c.start_position();
    chunk.tokens.assign(c.tokens().begin(), c.tokens().end());
    chunk.load_ticket = c.load_ticket();
    for (const auto& t : c.samples()) {
      chunk.samples.push_back({SequenceId(t.request_id()),
                               t.sample_index(),
                               t.output_position(),
                               {t.banned_tokens().begin(), t.banned_tokens().end()}});
    }
    plan.chunks.push_back(std::move(chunk));
  }
  if (in.has_rotation()) {
    const auto& r = in.rotation();
    if (r.replicas_size() < 2 || r.replica() >= static_cast<uint32_t>(r.replicas_size()) ||
        r.batch() > 255) {
      return absl::InvalidArgumentError(absl::StrCat("rotation of replica ", r.replica(), " of ",
                                                     r.replicas_size(), ", batch ", r.batch()));
    }
    plan.rotation.batch = static_cast<int32_t>(r.batch());
    plan.rotation.replica = static_cast<int32_t>(r.replica());
    plan.rotation.replicas.assign(r.replicas().begin(), r.replicas().end());
  }
  return plan;
}

void ToProto(const StepResult& result, control::StepResult* out) {
  out->set_step_id(result.step_id);
  for (const SampledToken& t : result.tokens) {
    auto* token = out->add_tokens();
    token->set_request_id(t.request_id.value());
    token->set_token(t.token);
    token->set_logprob(t.logprob);
    for (const auto& [id, lp] : t.top_logprobs) {
      auto* top = token->add_top();
      top->set_token(id);
      top->set_logprob(lp);
    }
  }
  for (const auto& [id, status] : result.failed) {
    auto* f = out->add_failed();
    f->set_request_id(id.value());
    ToProto(status, f->mutable_status());
  }
  for (PoolIndex pool : result.dead_pools) out->add_dead_pools(pool.value());
  auto* timing = out->mutable_timing();
  timing->set_total_us(result.timing.total_us);
  timing->set_gemm_us(result.timing.gemm_us);
  timing->set_attention_us(result.timing.attention_us);
  timing->set_sample_us(result.timing.sample_us);
  timing->set_bytes_sent(result.timing.bytes_sent);
  timing->set_bytes_received(result.timing.bytes_received);
  timing->set_rows(result.timing.rows);
  if (result.timing.plan_slack_us) timing->set_plan_slack_us(*result.timing.plan_slack_us);
  if (!result.status.ok()) ToProto(result.status, out->mutable_status());
}

StepResult FromProto(const control::StepResult& in) {
  StepResult result;
  result.step_id = in.step_id();
  for (const auto& t : in.tokens()) {
    SampledToken token;
    token.request_id = SequenceId(t.request_id());
    token.token = t.token();
    token.logprob = t.logprob();
    for (const auto& top : t.top()) token.top_logprobs.emplace_back(top.token(), top.logprob());
    result.tokens.push_back(std::move(token));
  }
  for (const auto& f : in.failed())
    result.failed.emplace_back(SequenceId(f.request_id()), FromProto(f.status()));
  for (uint32_t pool : in.dead_pools()) result.dead_pools.push_back(PoolIndex(pool));
  const auto& t = in.timing();
  result.timing = {t.total_us(),   t.gemm_us(),        t.attention_us(), t.sample_us(),
                   t.bytes_sent(), t.bytes_received(), t.rows()};
  if (t.has_plan_slack_us()) result.timing.plan_slack_us = t.plan_slack_us();
  result.status = FromProto(in.status());
  return result;
}

}  // namespace strata
