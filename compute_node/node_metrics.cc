#include "compute_node/node_metrics.h"

#include <algorithm>

#include "compute_node/linear.h"

namespace strata {

ComputeNodeMetrics::ComputeNodeMetrics(std::shared_ptr<metrics::MetricsRegistry> registry,
                                       std::string node)
    : registry_(std::move(registry)), node_(std::move(node)) {
  prometheus::Registry& r = registry_->registry();
  const prometheus::Labels labels = {{"node", node_}};
  auto counter = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
  };
  auto gauge = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
  };
  steps_ = counter("strata_compute_node_steps_total", "Steps executed.");
  step_seconds_total_ = counter("strata_compute_node_step_seconds_total", "Time in steps.");
  gemm_seconds_ = counter("strata_compute_node_gemm_seconds_total",
                          "Time in the GEMM parts of steps (projections, FFN, logits).");
  wait_seconds_ = counter("strata_compute_node_attention_wait_seconds_total",
                          "Time steps spent waiting for attention (memory nodes, or local).");
  rows_ = counter("strata_compute_node_tokens_total", "Token rows computed.");
  failed_steps_ = counter("strata_compute_node_failed_steps_total", "Steps that failed whole.");
  step_seconds_ = &prometheus::BuildHistogram()
                       .Name("strata_compute_node_step_seconds")
                       .Help("Step time on the compute node.")
                       .Register(r)
                       .Add(labels, metrics::FastLatencyBuckets());
  step_rows_ = &prometheus::BuildHistogram()
                    .Name("strata_compute_node_batch_tokens")
                    .Help("Token rows per step.")
                    .Register(r)
                    .Add(labels, metrics::CountBuckets(1 << 14));
  round_trip_ = &prometheus::BuildHistogram()
                     .Name("strata_attention_round_trip_seconds")
                     .Help("Per layer: first q/k/v frame sent to last attention answer received.")
                     .Register(r)
                     .Add(labels, metrics::FastLatencyBuckets());
  plan_wait_ = &prometheus::BuildHistogram()
                    .Name("strata_compute_node_plan_wait_seconds")
                    .Help(
                        "Between steps: from writing a step's result to having the next plan "
                        "(the round trip through the scheduler, unless it sent the plan "
                        "ahead; idle periods without requests count too).")
                    .Register(r)
                    .Add(labels, metrics::FastLatencyBuckets());
  bubble_ = &prometheus::BuildGauge()
                 .Name(metrics::kBubbleRatio)
                 .Help(metrics::kBubbleRatioHelp)
                 .Register(r)
                 .Add({{"node", node_}, {"role", "compute"}});
  kv_total_ = gauge("strata_compute_node_local_kv_tokens",
                    "Local KV token slots (co-located attention; 0 when disaggregated).");
  kv_used_ = gauge("strata_compute_node_local_kv_tokens_used", "Local KV token slots in use.");
  gemm_primitives_ =
      gauge("strata_compute_node_gemm_primitives",
            "oneDNN matmul primitives cached (two per linear layer and batch-size bucket met; "
            "bounded, see README.md, \"Memory of a compute node\").");
  bytes_ = &prometheus::BuildCounter()
                .Name(metrics::kDataPlaneBytes)
                .Help(metrics::kDataPlaneBytesHelp)
                .Register(r);
  errors_ = &prometheus::BuildCounter()
                 .Name("strata_data_plane_errors_total")
                 .Help(
                     "Data-plane faults, by kind: checksum (payload mismatch), error_frame "
                     "(the peer reported an error), stale (late or unexpected frames), "
                     "timeout (no answer within the layer deadline).")
                 .Register(r);
  for (const char* kind : {"checksum", "error_frame", "stale", "timeout"}) {
    errors_->Add({{"node", node_}, {"kind", kind}});
  }
  contexts_ = &prometheus::BuildCounter()
                   .Name("strata_context_frames_total")
                   .Help(
                       "Rotational pipelining: batch contexts handed between compute replicas, "
                       "by kind: sent, received, rejected (malformed: header, size, checksum), "
                       "stale (another epoch, or a step this replica had finished with).")
                   .Register(r);
  for (const char* kind : {"sent", "received", "rejected", "stale"}) {
    contexts_->Add({{"node", node_}, {"kind", kind}});
  }
  step_frames_ = &prometheus::BuildCounter()
                      .Name("strata_step_channel_frames_total")
                      .Help(
                          "The step channel (plans from the scheduler over the data plane), by "
                          "kind: plan (queued to run), refused (a frame answered with an error "
                          "without running: bad header, checksum, seal or message), result (sent).")
                      .Register(r);
  for (const char* kind : {"plan", "refused", "result"}) {
    step_frames_->Add({{"node", node_}, {"kind", kind}});
  }
  plans_polled_ = &prometheus::BuildCounter()
                       .Name("strata_step_channel_plans_polled_total")
                       .Help(
                           "Plans that the step thread, idle, received itself by progressing "
                           "the step channel's transport (--plan_spin_us), rather than the "
                           "channel's transport thread.")
                       .Register(r)
                       .Add({{"node", node_}});
  answers_polled_ = &prometheus::BuildCounter()
                         .Name("strata_data_plane_answers_polled_total")
                         .Help(
                             "Attention answers from memory nodes that the step thread, waiting "
                             "for its layer, took off the data plane's transport itself "
                             "(answer_spin), rather than the transport thread.")
                         .Register(r)
                         .Add({{"node", node_}});
  registry_->AddRefresh([this] { Refresh(); });
}

void ComputeNodeMetrics::OnStep(const StepResult& result) {
  const StepTiming& t = result.timing;
  steps_->Increment();
  if (!result.status.ok()) failed_steps_->Increment();
  step_seconds_total_->Increment(t.total_us * 1e-6);
  gemm_seconds_->Increment(t.gemm_us * 1e-6);
  wait_seconds_->Increment(t.attention_us * 1e-6);
  rows_->Increment(static_cast<double>(t.rows));
  step_seconds_->Observe(t.total_us * 1e-6);
  step_rows_->Observe(static_cast<double>(t.rows));
}

void ComputeNodeMetrics::OnLayerRoundTrip(double seconds) { round_trip_->Observe(seconds); }

void ComputeNodeMetrics::OnPlanWait(double seconds) {
  plan_wait_->Observe(seconds);
  std::lock_guard<std::mutex> lock(window_mu_);
  plan_wait_total_ += seconds;
}

void ComputeNodeMetrics::Attach(const ComputeNode* node) { compute_node_.store(node); }

void ComputeNodeMetrics::AttachStepChannel(const StepChannel* channel) {
  step_channel_.store(channel);
}

void ComputeNodeMetrics::Refresh() {
  {
    std::lock_guard<std::mutex> lock(window_mu_);
    const double wall = window_.ElapsedSeconds();
    window_.Reset();
    const double idle = wait_seconds_->Value() + plan_wait_total_, steps = steps_->Value();
    // Idle share of an interval in which steps ran; 0 when nothing was asked of it.
    bubble_->Set(steps > last_steps_ && wall > 0 ? std::clamp((idle - last_idle_) / wall, 0.0, 1.0)
                                                 : 0.0);
    last_idle_ = idle;
    last_steps_ = steps;
  }
  gemm_primitives_->Set(static_cast<double>(NumGemmPrimitives()));
  if (const StepChannel* channel = step_channel_.load(); channel != nullptr) {
    const StepChannelStats c = channel->stats();
    metrics::SetCounterTo(step_frames_->Add({{"node", node_}, {"kind", "plan"}}),
                          static_cast<double>(c.plans));
    metrics::SetCounterTo(step_frames_->Add({{"node", node_}, {"kind", "refused"}}),
                          static_cast<double>(c.refused));
    metrics::SetCounterTo(step_frames_->Add({{"node", node_}, {"kind", "result"}}),
                          static_cast<double>(c.results));
    metrics::SetCounterTo(*plans_polled_, static_cast<double>(c.polled));
  }
  const ComputeNode* node = compute_node_.load();
  if (node == nullptr) return;
  const NodeStatus status = node->Status();
  const bool remote = node->remote() != nullptr || node->rotational();
  if (node->rotational()) {
    const ContextExchangeStats c = node->context_stats();
    metrics::SetCounterTo(contexts_->Add({{"node", node_}, {"kind", "sent"}}),
                          static_cast<double>(c.sent));
    metrics::SetCounterTo(contexts_->Add({{"node", node_}, {"kind", "received"}}),
                          static_cast<double>(c.received));
    metrics::SetCounterTo(contexts_->Add({{"node", node_}, {"kind", "rejected"}}),
                          static_cast<double>(c.rejected));
    metrics::SetCounterTo(contexts_->Add({{"node", node_}, {"kind", "stale"}}),
                          static_cast<double>(c.stale));
  }
  kv_total_->Set(remote ? 0 : static_cast<double>(status.kv_slots_total));
  kv_used_->Set(remote ? 0 : static_cast<double>(status.kv_slots_in_tables));
  if (!remote) return;
  const RemoteAttentionStats s = node->remote_stats();
  for (const auto& [peer, b] : s.by_peer) {
    metrics::SetCounterTo(bytes_->Add({{"node", node_}, {"peer", peer}, {"direction", "sent"}}),
                          static_cast<double>(b.sent));
    metrics::SetCounterTo(bytes_->Add({{"node", node_}, {"peer", peer}, {"direction", "received"}}),
                          static_cast<double>(b.received));
  }
  metrics::SetCounterTo(errors_->Add({{"node", node_}, {"kind", "checksum"}}),
                        static_cast<double>(s.checksum_failures));
  metrics::SetCounterTo(errors_->Add({{"node", node_}, {"kind", "error_frame"}}),
                        static_cast<double>(s.error_frames));
  metrics::SetCounterTo(errors_->Add({{"node", node_}, {"kind", "stale"}}),
                        static_cast<double>(s.stale_frames));
  metrics::SetCounterTo(errors_->Add({{"node", node_}, {"kind", "timeout"}}),
                        static_cast<double>(s.timeouts));
  metrics::SetCounterTo(*answers_polled_, static_cast<double>(s.answers_polled));
}

}  // namespace strata
