// server: the scheduler and the OpenAI-compatible frontend.
//
//   server --model=DIR [--port=8000] [--control_port=50050] [--compute_nodes=1]
//          [--memory_nodes=0] ...
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/base/cpu_flags.h"
#include "common/base/logging.h"
#include "common/base/mutex_flags.h"
#include "common/base/shutdown.h"
#include "common/control/cluster_flags.h"
#include "common/model/kv_dtype.h"
#include "common/transport/transport_flags.h"
#include "server/control_plane.h"
#include "server/server_app.h"

// Scheduler defaults come from SchedulerConfig, declared once there.
ABSL_FLAG(std::string, model, "", "Hugging Face model directory (config.json, tokenizer)");
ABSL_FLAG(std::string, served_model_name, "", "Model name in the API (default: directory name)");
ABSL_FLAG(std::string, tool_call_parser, "",
          "How the model writes tool calls: hermes (Qwen 2.5, Hermes), llama3 or mistral "
          "(default: from the chat template; hermes when it does not say)");
ABSL_FLAG(std::string, host, "127.0.0.1", "HTTP listen address");
ABSL_FLAG(int, port, 8000, "HTTP port (0: any free port)");
ABSL_FLAG(std::string, control_host, "127.0.0.1", "Control-plane listen address");
ABSL_FLAG(int, control_port, 50050, "Control-plane port (0: any free port)");
ABSL_FLAG(std::string, port_file, "", "Write the bound ports here as JSON");
ABSL_FLAG(int, grpc_port, -1, "gRPC API port (-1: off, 0: any free port)");
ABSL_FLAG(std::string, grpc_host, "127.0.0.1", "gRPC API listen address");
ABSL_FLAG(int, compute_nodes, 1, "Compute nodes to wait for before /health is 200");
ABSL_FLAG(int, memory_nodes, 0, "Memory nodes to wait for (0: co-located attention)");
ABSL_FLAG(int64_t, max_model_len, 0, "Context length (0: the model's)");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16",
          "The KV cache's element type on every node: bf16 or f16 (compute nodes must be "
          "started with the same --kv_cache_dtype)");
ABSL_FLAG(int64_t, max_num_seqs, strata::SchedulerConfig().max_num_seqs, "Sequences per step");
ABSL_FLAG(int, max_plans_in_flight, 0,
          "Step plans a compute node holds at once (0: 2 with asynchronous scheduling or "
          "--pipelining=two, else 1)");
ABSL_FLAG(strata::Pipelining, pipelining, strata::Pipelining::kOff,
          "Batches in flight with offloaded attention: off; two (two plans of different "
          "sequences on each compute node, balanced by rows and KV read, which the node runs "
          "side by side; start compute nodes with --pipelining=two as well); or fixed (one "
          "batch per compute node, the nodes' step starts spaced by the step period over the "
          "number of nodes, so that their attention takes turns on the memory nodes); or "
          "rotational (--rotation_batches n batches rotate over n - 1 compute replicas started "
          "with --pipelining=rotational: each slice of layers runs on the next replica, the "
          "batch's context moving while its attention runs)");
ABSL_FLAG(int, rotation_batches, 3,
          "Rotational pipelining: batches n in flight over the n - 1 compute replicas");
ABSL_FLAG(std::string, step_channel, "data_plane",
          "How step plans and results travel to compute nodes: data_plane (each node's step "
          "channel, over --step_channel_ucx_tls; nodes without one use gRPC) or grpc (the "
          "RunSteps stream)");
ABSL_FLAG(bool, allow_mixed_isa, false,
          "Admit nodes whose kernel path (STRATA_CPU_ISA) or kernel fingerprints differ from "
          "the other nodes' (server/kernel_agreement.h), giving up bit-identical results");
ABSL_FLAG(bool, async_scheduling, false,
          "Send a batch's next step while the current one runs; the compute node feeds each "
          "sequence the token it sampled last. Output is identical to synchronous scheduling. "
          "Off under every --pipelining other than off, which schedule their batches' steps "
          "themselves");
ABSL_FLAG(double, plan_ahead_lead, strata::SchedulerConfig().plan_ahead_lead,
          "Asynchronous scheduling: build the next plan this fraction of the node's step time "
          "before the running step is expected to end (1: as soon as it starts)");
ABSL_FLAG(int64_t, max_num_batched_tokens, strata::SchedulerConfig().max_num_batched_tokens,
          "Rows per step");
ABSL_FLAG(int64_t, max_prefill_tokens, strata::SchedulerConfig().max_prefill_tokens,
          "Prompt rows per step");
ABSL_FLAG(int64_t, prefill_chunk_tokens, strata::SchedulerConfig().prefill_chunk_tokens,
          "Prefill chunk size (0: no chunking)");
ABSL_FLAG(int64_t, max_waiting, strata::SchedulerConfig().max_waiting,
          "Queued requests before refusing with 429");
ABSL_FLAG(strata::PolicyKind, policy, strata::SchedulerConfig().policy,
          "Scheduling policy: fifo or priority");
ABSL_FLAG(bool, enable_prefix_caching, strata::SchedulerConfig().enable_prefix_caching,
          "Reuse cached prompt prefixes");
ABSL_FLAG(double, kv_disk_ttl_s, absl::ToDoubleSeconds(strata::SchedulerConfig().disk_ttl),
          "Memory nodes' disk tiers: KV blocks idle this long are deleted (persisted KV is "
          "user data)");
ABSL_FLAG(bool, kv_disk_load_when_faster, strata::SchedulerConfig().disk_load_when_faster,
          "Disk tiers: read a prefix back only when that is measured to be faster than "
          "recomputing it (false: always read it)");
ABSL_FLAG(strata::KvEviction, kv_eviction_policy, strata::SchedulerConfig().kv_eviction,
          "Which idle cached KV block DRAM gives up first: lru, fifo, or scheduler-aware "
          "(blocks the next --kv_lookahead_requests waiting requests need go last, and their "
          "history on disk is prefetched into DRAM before they run)");
ABSL_FLAG(int32_t, kv_lookahead_requests, strata::SchedulerConfig().lookahead_requests,
          "Scheduler-aware eviction: how many waiting requests the look-ahead window holds at "
          "most");
ABSL_FLAG(bool, kv_lookahead_fits_dram, strata::SchedulerConfig().lookahead_fits_dram,
          "Scheduler-aware eviction: the look-ahead window also ends before the first waiting "
          "request whose blocks would not fit in its pool's DRAM beside the running requests "
          "(false: always --kv_lookahead_requests)");
ABSL_FLAG(double, kv_prefetch_reserve, strata::SchedulerConfig().kv_prefetch_reserve,
          "Scheduler-aware eviction: the fraction of each pool's KV slots kept for the "
          "look-ahead window's prefetches; a request is admitted beside running ones only if "
          "that much stays free or idle (0: no reserve)");
ABSL_FLAG(bool, kv_disk_save_on_fill, strata::SchedulerConfig().disk_save_on_fill,
          "Disk tiers: save each KV block of a running request as soon as it is full "
          "(HILOS's delayed write-back), rather than when the request finishes or is "
          "preempted");
ABSL_FLAG(strata::ContextOverflow, context_overflow, strata::SchedulerConfig().context_overflow,
          "A prompt that does not fit in the context with its max_tokens: error (400), or "
          "truncate (keep its first --context_keep_tokens and its most recent tokens, drop "
          "the middle; the kept tail's cached KV moves to its new positions, K re-rotated)");
ABSL_FLAG(int64_t, context_keep_tokens, strata::SchedulerConfig().context_keep_tokens,
          "--context_overflow=truncate: tokens kept at the start of the prompt (rounded up to "
          "whole prefix-cache blocks)");
ABSL_FLAG(bool, kv_disk_layerwise, strata::SchedulerConfig().disk_layerwise,
          "Disk tiers: layer-wise pre-loading. A request whose prefix is read from disk "
          "computes its new tokens while the read runs, each layer waiting on the node for "
          "that layer (false: its rows wait for the whole read)");
ABSL_FLAG(int64_t, kv_disk_load_timeout_ms, 2000,
          "Disk tiers: a batch of loads not back by then fails, and its requests recompute "
          "those tokens instead (a slow disk degrades to 'not cached')");
ABSL_FLAG(int64_t, request_timeout_s, 0, "Per-request timeout, seconds (0: none)");
ABSL_FLAG(std::string, api_key, "",
          "Require 'Authorization: Bearer KEY' on /v1 and the gRPC API (visible in ps: prefer "
          "--api_key_file or STRATA_API_KEY)");
ABSL_FLAG(std::string, api_key_file, "", "Read the API key from this file (mode 0600)");
ABSL_FLAG(int, http_threads, 2, "HTTP event-loop threads");
ABSL_FLAG(int64_t, max_connections, 4096, "Concurrent HTTP connections");
ABSL_FLAG(int64_t, max_body_bytes, 8 << 20, "Largest request body");
ABSL_FLAG(int64_t, max_header_bytes, 16 << 10, "Largest request header block");
ABSL_FLAG(int64_t, request_read_timeout_s, 15, "Seconds a client has to send a whole request");
ABSL_FLAG(int64_t, idle_timeout_s, 65, "Seconds a keep-alive connection may sit idle");
ABSL_FLAG(int64_t, max_stream_buffer_bytes, 4 << 20,
          "Unread stream bytes queued for a slow client before its stream is cut");
ABSL_FLAG(int64_t, drain_timeout_s, 30, "Seconds to let streams finish on SIGTERM");
ABSL_FLAG(int64_t, step_timeout_s, 60, "Seconds before a compute node's step counts as hung");
ABSL_FLAG(int64_t, heartbeat_timeout_ms,
          absl::ToInt64Milliseconds(strata::ServerOptions().heartbeat_timeout),
          "A node that sends no heartbeat for this long is dead (nodes send one every 500 ms)");
ABSL_FLAG(bool, shutdown_nodes_on_exit, false, "Ask registered nodes to exit when stopping");

int main(int argc, char** argv) {
  strata::SetServiceThreadsYieldDefault(false);
  absl::ParseCommandLine(argc, argv);
  strata::ApplyMutexDeadlockDetectionFlag();
  strata::ApplyServiceThreadsFlag();
  strata::InstallShutdownHandlers();
  strata::SetLogTag("server");
  if (absl::Status cpus = strata::ApplyCpusFlag(0); !cpus.ok()) {
    LOG(ERROR) << "--cpus: " << cpus.message();
    return 2;
  }
  strata::ServerOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  o.tool_call_parser = absl::GetFlag(FLAGS_tool_call_parser);
  if (std::string name = o.tool_call_parser;
      !name.empty() && name != "hermes" && name != "llama3" && name != "mistral") {
    LOG(ERROR) << "--tool_call_parser must be hermes, llama3 or mistral";
    return 2;
  }
  o.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  o.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  strata::KvDType kv_dtype;
  if (std::string error;
      !strata::ParseEnumName(o.kv_cache_dtype, strata::kKvDTypeNames, &kv_dtype, &error)) {
    LOG(ERROR) << "--kv_cache_dtype: " << error;
    return 2;
  }
  o.control_host = absl::GetFlag(FLAGS_control_host);
  o.control_port = absl::GetFlag(FLAGS_control_port);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.grpc_host = absl::GetFlag(FLAGS_grpc_host);
  o.grpc_port = absl::GetFlag(FLAGS_grpc_port);
  o.expected_compute_nodes = absl::GetFlag(FLAGS_compute_nodes);
  o.expected_memory_nodes = absl::GetFlag(FLAGS_memory_nodes);
  o.allow_mixed_isa = absl::GetFlag(FLAGS_allow_mixed_isa);
  if (absl::GetFlag(FLAGS_step_channel) != "data_plane" &&
      absl::GetFlag(FLAGS_step_channel) != "grpc") {
    LOG(ERROR) << "--step_channel: data_plane or grpc, not " << absl::GetFlag(FLAGS_step_channel);
    return 2;
  }
  o.data_plane_steps = absl::GetFlag(FLAGS_step_channel) == "data_plane";
  // At least two of the nodes' heartbeats: one late heartbeat must not kill a node.
  o.heartbeat_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  if (const absl::Duration least = 2 * strata::ControlPlaneOptions().heartbeat_interval;
      o.heartbeat_timeout < least) {
    LOG(ERROR) << "--heartbeat_timeout_ms must be at least " << absl::ToInt64Milliseconds(least)
               << " (nodes send a heartbeat every "
               << absl::FormatDuration(strata::ControlPlaneOptions().heartbeat_interval) << ")";
    return 2;
  }
  o.step_transport = strata::transport::StepChannelConfigFromFlags();
  auto api_key = strata::ApiKeyFromFlags(absl::GetFlag(FLAGS_api_key),
                                         absl::GetFlag(FLAGS_api_key_file), "STRATA_API_KEY");
  if (!api_key.ok()) {
    LOG(ERROR) << api_key.status().message();
    return 2;
  }
  o.api_key = *api_key;
  o.cluster_auth = strata::ClusterAuthOptionsFromFlags();
  o.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  o.step_timeout = absl::Seconds(absl::GetFlag(FLAGS_step_timeout_s));
  o.disk_load_timeout =
      absl::Milliseconds(std::max<int64_t>(1, absl::GetFlag(FLAGS_kv_disk_load_timeout_ms)));
  o.scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  o.scheduler.pipelining = absl::GetFlag(FLAGS_pipelining);
  o.scheduler.async_scheduling = absl::GetFlag(FLAGS_async_scheduling);
  if (o.scheduler.async_scheduling && o.scheduler.pipelining != strata::Pipelining::kOff) {
    LOG(WARNING) << "asynchronous scheduling is off under --pipelining="
                 << AbslUnparseFlag(o.scheduler.pipelining);
    o.scheduler.async_scheduling = false;
  }
  o.scheduler.plan_ahead_lead = absl::GetFlag(FLAGS_plan_ahead_lead);
  o.scheduler.max_plans_in_flight = absl::GetFlag(FLAGS_max_plans_in_flight);
  if (o.scheduler.pipelining == strata::Pipelining::kRotational) {
    o.scheduler.max_plans_in_flight = absl::GetFlag(FLAGS_rotation_batches);
  }
  if (o.scheduler.max_plans_in_flight == 0) {
    o.scheduler.max_plans_in_flight =
        o.scheduler.async_scheduling || o.scheduler.pipelining == strata::Pipelining::kTwo ? 2 : 1;
  }
  o.scheduler.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  o.scheduler.max_prefill_tokens = absl::GetFlag(FLAGS_max_prefill_tokens);
  o.scheduler.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);
  o.scheduler.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  o.scheduler.policy = absl::GetFlag(FLAGS_policy);
  o.scheduler.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  o.scheduler.default_timeout = absl::Seconds(absl::GetFlag(FLAGS_request_timeout_s));
  o.scheduler.disk_load_when_faster = absl::GetFlag(FLAGS_kv_disk_load_when_faster);
  o.scheduler.disk_layerwise = absl::GetFlag(FLAGS_kv_disk_layerwise);
  o.scheduler.disk_save_on_fill = absl::GetFlag(FLAGS_kv_disk_save_on_fill);
  o.scheduler.context_overflow = absl::GetFlag(FLAGS_context_overflow);
  o.scheduler.context_keep_tokens = absl::GetFlag(FLAGS_context_keep_tokens);
  o.scheduler.kv_eviction = absl::GetFlag(FLAGS_kv_eviction_policy);
  o.scheduler.lookahead_requests = absl::GetFlag(FLAGS_kv_lookahead_requests);
  o.scheduler.lookahead_fits_dram = absl::GetFlag(FLAGS_kv_lookahead_fits_dram);
  o.scheduler.kv_prefetch_reserve = absl::GetFlag(FLAGS_kv_prefetch_reserve);
  o.scheduler.disk_ttl = absl::Seconds(std::max(1.0, absl::GetFlag(FLAGS_kv_disk_ttl_s)));
  o.http.host = absl::GetFlag(FLAGS_host);
  o.http.port = absl::GetFlag(FLAGS_port);
  o.http.threads = absl::GetFlag(FLAGS_http_threads);
  o.http.max_connections = absl::GetFlag(FLAGS_max_connections);
  o.http.max_body_bytes = absl::GetFlag(FLAGS_max_body_bytes);
  o.http.max_header_bytes = absl::GetFlag(FLAGS_max_header_bytes);
  o.http.request_read_timeout = absl::Seconds(absl::GetFlag(FLAGS_request_read_timeout_s));
  o.http.idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_idle_timeout_s));
  o.http.max_stream_buffer_bytes = absl::GetFlag(FLAGS_max_stream_buffer_bytes);
  if (o.model_dir.empty()) {
    LOG(ERROR) << "--model is required";
    return 2;
  }
  auto app = strata::ServerApp::Start(std::move(o));
  if (!app.ok()) {
    LOG(ERROR) << "cannot start: " << app.status();
    return 1;
  }
  strata::WaitForShutdown();
  (*app)->Shutdown(absl::GetFlag(FLAGS_shutdown_nodes_on_exit));
  return 0;
}
