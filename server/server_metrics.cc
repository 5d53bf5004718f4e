#include "server/server_metrics.h"

#include <set>

namespace strata {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

ServerMetrics::ServerMetrics(std::shared_ptr<metrics::MetricsRegistry> registry,
                             const std::string& model_name, const Scheduler* scheduler)
    : registry_(std::move(registry)), model_(model_name), scheduler_(scheduler) {
  prometheus::Registry& r = registry_->registry();
  const prometheus::Labels model = {{"model_name", model_}};
  auto gauge = [&](const std::string& name, const std::string& help) {
    return &BuildGauge().Name(name).Help(help).Register(r).Add(model);
  };
  auto counter = [&](const std::string& name, const std::string& help) {
    return &BuildCounter().Name(name).Help(help).Register(r).Add(model);
  };
  auto histogram = [&](const std::string& name, const std::string& help,
                       std::vector<double> buckets) {
    return &BuildHistogram().Name(name).Help(help).Register(r).Add(model, std::move(buckets));
  };
  running_ = gauge("strata_num_requests_running", "Requests in the running batch.");
  waiting_ = gauge("strata_num_requests_waiting", "Requests waiting to be admitted.");
  kv_usage_ = gauge("strata_kv_cache_usage_perc",
                    "KV cache usage over alive pools, as a fraction (1 = full), as vLLM.");
  lookahead_window_ = gauge("strata_kv_lookahead_window_requests",
                            "Scheduler-aware eviction: waiting requests whose blocks the "
                            "look-ahead window protects and prefetches now.");
  paged_waste_ = gauge("strata_kv_paged_waste_tokens",
                       "KV slots that 16-token pages would waste on the running sequences "
                       "(strata allocates per token and wastes none).");
  alive_compute_ = gauge("strata_compute_nodes_alive", "Compute nodes taking steps.");
  step_period_ = gauge("strata_step_period_seconds",
                       "Smoothed wall time of a step, from its plan sent to its result.");
  stagger_ = gauge("strata_pipeline_stagger_seconds",
                   "Fixed staggered pipelining: the spacing of compute replicas' step starts "
                   "(step period over replicas; 0 in other modes).");
  plan_ahead_margin_ = gauge("strata_plan_ahead_margin_seconds",
                             "Asynchronous scheduling: how much earlier than its lead the plan "
                             "ahead goes out, learnt from compute nodes that waited for plans "
                             "(the largest over compute nodes).");
  step_compute_ = gauge("strata_step_compute_seconds",
                        "Smoothed GEMM time of a decode step on its compute node (t_m).");
  step_attention_ = gauge("strata_step_attention_seconds",
                          "Smoothed attention time of a decode step (t_a; under two batches "
                          "in flight, the wait plus the GEMMs that hid the rest).");
  advised_memory_ = gauge("strata_advised_memory_nodes",
                          "Memory nodes that would make t_a = t_m / (batches in flight - 1) "
                          "(0: co-located or not measured yet).");
  prefix_queries_ =
      counter("strata_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.");
  prefix_hits_ = counter("strata_prefix_cache_hits_total",
                         "Prompt tokens found in the prefix cache (not recomputed).");
  prefix_misses_ = counter("strata_prefix_cache_misses_total",
                           "Prompt tokens looked up and found in no tier (computed).");
  tier_hits_ = &BuildCounter()
                    .Name("strata_prefix_cache_tier_hits_total")
                    .Help("Prompt tokens found in the prefix cache, by tier: dram, disk.")
                    .Register(r);
  admission_loads_ =
      &BuildCounter()
           .Name("strata_kv_admission_disk_loads_total")
           .Help(
               "Scheduler-aware eviction: KV blocks a request read from disk when it was "
               "admitted, by why DRAM lacked them: outside_window (the request was not in the "
               "look-ahead window), prefetching (its prefetch was still being read), "
               "not_prefetched (no room to prefetch it, or evicted after its prefetch).")
           .Register(r);
  disk_blocks_ =
      &BuildCounter()
           .Name("strata_kv_disk_blocks_total")
           .Help(
               "KV blocks moved by the disk tier, by event: saved, loaded, "
               "save_failed (a full disk, an I/O error: not cached), load_failed "
               "(recomputed; a checksum or I/O failure also drops the block), recomputed (found "
               "on disk, but recomputing was measured to be faster), prefetched "
               "(read into DRAM for a request still in the queue: "
               "--kv_eviction_policy=scheduler-aware).")
           .Register(r);
  preloads_ = &BuildCounter()
                   .Name("strata_kv_disk_preloads_total")
                   .Help(
                       "Requests whose new tokens computed while their prefix was read from "
                       "disk (layer-wise pre-loading), by outcome: ok, failed (a load failed; "
                       "the request was preempted and recomputed what was not cached).")
                   .Register(r);
  truncations_ = counter("strata_context_truncations_total",
                         "Requests whose prompt lost its middle to fit the context "
                         "(--context_overflow=truncate).");
  truncation_tokens_ = &BuildCounter()
                            .Name("strata_context_truncation_tokens_total")
                            .Help(
                                "Prompt tokens of truncated requests, by event: dropped (the "
                                "middle), moved (kept tokens whose cached KV moved to their new "
                                "positions, K re-rotated, instead of being recomputed).")
                            .Register(r);
  evictions_ = &BuildCounter()
                    .Name("strata_kv_evictions_total")
                    .Help(
                        "Cached KV blocks given up, by tier and reason: dram/capacity (room "
                        "for new KV; saved to disk first where there is a disk tier), "
                        "disk/capacity (room for newer blocks), disk/ttl (idle past the TTL), "
                        "disk/checksum (failed a read).")
                    .Register(r);
  disk_extents_ = &BuildGauge()
                       .Name("strata_kv_disk_pool_blocks")
                       .Help(
                           "The scheduler's index of each pool's disk tier, in blocks, by "
                           "state: ready, writing, reading, free.")
                       .Register(r);
  preemptions_ = counter("strata_num_preemptions_total", "Requests preempted for KV room.");
  planner_shortfalls_ =
      counter("strata_planner_shortfalls_total",
              "Preemptions that freed fewer KV slots than the batch planner counted on, and "
              "chunks dropped for want of them. Nonzero means a bug in the planner's bound.");
  prompt_tokens_ = counter("strata_prompt_tokens_total", "Prompt tokens of admitted requests.");
  generation_tokens_ = counter("strata_generation_tokens_total", "Generated tokens.");
  prefill_rows_ = counter("strata_prefill_tokens_computed_total",
                          "Prompt tokens actually computed (prefix hits excluded, recomputation "
                          "after preemption included).");
  steps_ = counter("strata_scheduler_steps_total", "Steps planned and executed.");
  rejected_ = counter("strata_requests_rejected_total",
                      "Requests refused at admission (too long, never fitting, queue full).");
  success_ = &BuildCounter()
                  .Name("strata_request_success_total")
                  .Help("Finished requests, by finish reason.")
                  .Register(r);
  pool_tokens_ = &BuildGauge()
                      .Name("strata_kv_pool_tokens")
                      .Help(
                          "KV token slots per pool (memory node, or compute node when "
                          "co-located), by state: used, free, reclaimable (cached, "
                          "unreferenced), total.")
                      .Register(r);
  pool_alive_ =
      &BuildGauge().Name("strata_kv_pool_alive").Help("1 if the pool is serving.").Register(r);

  const auto latency = metrics::LatencyBuckets();
  ttft_ = histogram("strata_time_to_first_token_seconds", "Time to first token.", latency);
  itl_ = histogram("strata_inter_token_latency_seconds", "Time between output tokens.", latency);
  e2e_ = histogram("strata_e2e_request_latency_seconds", "End-to-end request latency.", latency);
  queue_ =
      histogram("strata_request_queue_time_seconds", "Time waiting before admission.", latency);
  prefill_ = histogram("strata_request_prefill_time_seconds",
                       "Time from admission to the first token.", latency);
  decode_ = histogram("strata_request_decode_time_seconds",
                      "Time from the first token to the last.", latency);
  prompt_len_ = histogram("strata_request_prompt_tokens", "Prompt length of finished requests.",
                          metrics::CountBuckets(1 << 17));
  generation_len_ =
      histogram("strata_request_generation_tokens", "Generated tokens of finished requests.",
                metrics::CountBuckets(1 << 17));
  step_time_ = histogram("strata_scheduler_step_seconds",
                         "Wall time of a step, plan to result, as the scheduler sees it.",
                         metrics::FastLatencyBuckets());
  step_rows_ = histogram("strata_scheduler_batch_tokens", "Token rows per step.",
                         metrics::CountBuckets(1 << 14));
  step_seqs_ = histogram("strata_scheduler_batch_sequences", "Sequences per step.",
                         metrics::CountBuckets(1 << 12));

  http_requests_ = &BuildCounter()
                        .Name("strata_http_requests_total")
                        .Help("HTTP requests, by route and status.")
                        .Register(r);
  http_latency_ = &BuildHistogram()
                       .Name("strata_http_request_duration_seconds")
                       .Help("HTTP request duration (streams: until the last event), by route.")
                       .Register(r);
  registry_->AddRefresh([this] { Refresh(); });
}

SchedulerObserver ServerMetrics::Observer() {
  SchedulerObserver o;
  o.on_step = [this](const StepPlan& plan, const StepResult&, absl::Duration wall) {
    step_time_->Observe(absl::ToDoubleSeconds(wall));
    step_rows_->Observe(static_cast<double>(plan.num_rows()));
    step_seqs_->Observe(static_cast<double>(plan.chunks.size()));
  };
  o.on_first_token = [this](uint64_t, absl::Duration, absl::Duration ttft) {
    ttft_->Observe(absl::ToDoubleSeconds(ttft));
  };
  o.on_inter_token = [this](absl::Duration itl) { itl_->Observe(absl::ToDoubleSeconds(itl)); };
  o.on_finish = [this](const GenerateRequest&, FinishReason, int64_t prompt_tokens,
                       int64_t generation_tokens, absl::Duration e2e, absl::Duration queue,
                       absl::Duration prefill, absl::Duration decode) {
    e2e_->Observe(absl::ToDoubleSeconds(e2e));
    queue_->Observe(absl::ToDoubleSeconds(queue));
    prefill_->Observe(absl::ToDoubleSeconds(prefill));
    decode_->Observe(absl::ToDoubleSeconds(decode));
    prompt_len_->Observe(static_cast<double>(prompt_tokens));
    generation_len_->Observe(static_cast<double>(generation_tokens));
  };
  return o;
}

void ServerMetrics::OnHttpRequest(const std::string& path, int status, double seconds) {
  // Known routes only: a label per unknown path would let clients grow the series set.
  static const std::set<std::string> kRoutes = {
      "/health",         "/ready",    "/metrics",    "/v1/models",
      "/v1/completions", "/tokenize", "/detokenize", "/v1/chat/completions"};
  const std::string route = kRoutes.count(path) ? path : "other";
  http_requests_
      ->Add({{"model_name", model_}, {"route", route}, {"status", std::to_string(status)}})
      .Increment();
  prometheus::Histogram* h;
  {
    std::lock_guard<std::mutex> lock(http_mu_);
    auto it = http_latency_by_route_.find(route);
    if (it == http_latency_by_route_.end()) {
      h = &http_latency_->Add({{"model_name", model_}, {"route", route}},
                              metrics::LatencyBuckets());
      http_latency_by_route_[route] = h;
    } else {
      h = it->second;
    }
  }
  h->Observe(seconds);
}

void ServerMetrics::Refresh() {
  const SchedulerStats s = scheduler_->Stats();
  running_->Set(static_cast<double>(s.num_running));
  waiting_->Set(static_cast<double>(s.num_waiting));
  kv_usage_->Set(s.kv_usage);
  paged_waste_->Set(static_cast<double>(s.kv_paged_waste_slots));
  lookahead_window_->Set(static_cast<double>(s.lookahead_window_requests));
  alive_compute_->Set(static_cast<double>(s.alive_executors));
  step_period_->Set(s.step_period_seconds);
  stagger_->Set(s.stagger_seconds);
  plan_ahead_margin_->Set(s.plan_ahead_margin_seconds);
  step_compute_->Set(s.step_compute_seconds);
  step_attention_->Set(s.step_attention_seconds);
  advised_memory_->Set(static_cast<double>(s.advised_memory_nodes));
  metrics::SetCounterTo(*prefix_queries_, static_cast<double>(s.prefix_query_tokens_total));
  metrics::SetCounterTo(*prefix_hits_, static_cast<double>(s.prefix_hit_tokens_total));
  metrics::SetCounterTo(*prefix_misses_,
                        static_cast<double>(std::max<int64_t>(
                            0, s.prefix_query_tokens_total - s.prefix_hit_tokens_total)));
  const auto add = [&](prometheus::Family<prometheus::Counter>* family,
                       std::map<std::string, std::string> labels, int64_t v) {
    labels["model_name"] = model_;
    metrics::SetCounterTo(family->Add(labels), static_cast<double>(v));
  };
  add(tier_hits_, {{"tier", "dram"}}, s.prefix_hit_tokens_total - s.disk_hit_tokens_total);
  add(tier_hits_, {{"tier", "disk"}}, s.disk_hit_tokens_total);
  add(disk_blocks_, {{"event", "saved"}}, s.disk_saved_blocks_total);
  add(disk_blocks_, {{"event", "loaded"}}, s.disk_loaded_blocks_total);
  add(disk_blocks_, {{"event", "save_failed"}}, s.disk_failed_saves_total);
  add(disk_blocks_, {{"event", "load_failed"}}, s.disk_failed_loads_total);
  add(disk_blocks_, {{"event", "recomputed"}}, s.disk_recomputed_blocks_total);
  add(disk_blocks_, {{"event", "prefetched"}}, s.disk_prefetched_blocks_total);
  add(admission_loads_, {{"why", "outside_window"}}, s.admission_loads_outside_window_total);
  add(admission_loads_, {{"why", "prefetching"}}, s.admission_loads_prefetching_total);
  add(admission_loads_, {{"why", "not_prefetched"}}, s.admission_loads_not_prefetched_total);
  add(preloads_, {{"outcome", "ok"}},
      s.disk_preloaded_requests_total - s.disk_preload_failed_total);
  add(preloads_, {{"outcome", "failed"}}, s.disk_preload_failed_total);
  add(evictions_, {{"tier", "dram"}, {"reason", "capacity"}}, s.dram_evicted_blocks_total);
  add(evictions_, {{"tier", "disk"}, {"reason", "capacity"}}, s.disk_evicted_blocks_total);
  add(evictions_, {{"tier", "disk"}, {"reason", "ttl"}}, s.disk_expired_blocks_total);
  add(evictions_, {{"tier", "disk"}, {"reason", "checksum"}}, s.disk_failed_loads_total);
  metrics::SetCounterTo(*truncations_, static_cast<double>(s.context_truncated_total));
  add(truncation_tokens_, {{"event", "dropped"}}, s.context_dropped_tokens_total);
  add(truncation_tokens_, {{"event", "moved"}}, s.context_moved_tokens_total);
  metrics::SetCounterTo(*preemptions_, static_cast<double>(s.num_preemptions_total));
  metrics::SetCounterTo(*planner_shortfalls_, static_cast<double>(s.planner_shortfalls_total));
  metrics::SetCounterTo(*prompt_tokens_, static_cast<double>(s.prompt_tokens_total));
  metrics::SetCounterTo(*generation_tokens_, static_cast<double>(s.generation_tokens_total));
  metrics::SetCounterTo(*prefill_rows_, static_cast<double>(s.prefill_rows_total));
  metrics::SetCounterTo(*steps_, static_cast<double>(s.steps_total));
  metrics::SetCounterTo(*rejected_, static_cast<double>(s.rejected_total));
  // vLLM's finished_reason values, present from the start so that rates exist at zero.
  std::map<std::string, int64_t> finished = {{"stop", 0}, {"length", 0}, {"abort", 0}};
  for (const auto& [reason, n] : s.finished_total) finished[reason] = n;
  for (const auto& [reason, n] : finished) {
    metrics::SetCounterTo(success_->Add({{"model_name", model_}, {"finished_reason", reason}}),
                          static_cast<double>(n));
  }
  for (const PoolStatus& p : s.pools) {
    const std::string name = p.name.empty() ? std::to_string(p.index.value()) : p.name;
    auto set = [&](const char* state, int64_t v) {
      pool_tokens_->Add({{"model_name", model_}, {"pool", name}, {"state", state}})
          .Set(static_cast<double>(v));
    };
    set("used", p.stats.used_slots);
    set("free", p.stats.free_slots);
    set("reclaimable", p.stats.reclaimable_slots);
    set("total", p.stats.total_slots);
    pool_alive_->Add({{"model_name", model_}, {"pool", name}}).Set(p.alive ? 1 : 0);
    if (p.has_disk) {
      auto disk = [&](const char* state, int64_t v) {
        disk_extents_->Add({{"model_name", model_}, {"pool", name}, {"state", state}})
            .Set(static_cast<double>(v));
      };
      disk("ready", p.disk.ready);
      disk("writing", p.disk.writing);
      disk("reading", p.disk.reading);
      disk("free", p.disk.free);
    }
  }
}

}  // namespace strata
