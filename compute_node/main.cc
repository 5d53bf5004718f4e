// compute_node: holds the model weights and runs every layer but attention.
//
//   compute_node --model=DIR --scheduler=HOST:PORT [--port=0] [--threads=N]
//                [--kv_disk_dir=DIR --kv_disk_budget_gib=N]   (co-located mode)
#include <omp.h>

#include <cstdlib>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/base/cpu_flags.h"
#include "common/base/logging.h"
#include "common/base/mutex_flags.h"
#include "common/base/shutdown.h"
#include "common/base/thread_name.h"
#include "common/base/trace_flags.h"
#include "common/base/wait_policy.h"
#include "common/control/cluster_flags.h"
#include "common/control/node_main.h"
#include "common/metrics/metrics.h"
#include "common/model/model_config.h"
#include "common/protocol/node_config_proto.h"
#include "common/protocol/pipelining.h"
#include "common/transport/transport_flags.h"
#include "compute_node/attention_backend.h"
#include "compute_node/compute_node.h"
#include "compute_node/linear.h"
#include "compute_node/node_metrics.h"
#include "compute_node/rotation.h"
#include "compute_node/service.h"
#include "compute_node/step_channel.h"
#include "kernels/cpu/fingerprint.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "memory_node/kv_disk_flags.h"
#include "memory_node/kv_disk_metrics.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, served_model_name, "", "Model name reported to the scheduler");
ABSL_FLAG(std::string, scheduler, "127.0.0.1:50050", "Scheduler control address");
ABSL_FLAG(std::string, name, "compute-0", "Node name (logs, metrics)");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on");
ABSL_FLAG(int, port, 0, "Control port (0: any free port)");
ABSL_FLAG(int, threads, 0,
          "Compute threads (0: OMP_NUM_THREADS, else the cores it may run on, fewer under a "
          "CPU quota)");
ABSL_FLAG(int64_t, kv_budget_mib, 1024, "Local KV cache for co-located mode, MiB");
ABSL_FLAG(int64_t, max_batch_rows, 2048, "Rows (tokens) per step");
ABSL_FLAG(int64_t, max_model_len, 0, "Context length (0: the model's)");
ABSL_FLAG(std::string, gemm, "",
          "Linear layers' GEMM: auto or own (strata's own on every CPU) or onednn (oneDNN's bf16 "
          "matmul wherever the CPU has AVX-512). Sets STRATA_GEMM; empty: STRATA_GEMM as "
          "given, else auto");
ABSL_FLAG(bool, prefault_kv, true, "Touch the KV cache at start-up");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16",
          "The KV cache's element type: bf16 or f16 (the scheduler's --kv_cache_dtype must match)");
// Defaults come from the options structs, declared once there.
ABSL_FLAG(int, attention_minibatches, strata::RemoteAttentionOptions().minibatches,
          "Disaggregated mode: mini-batches per memory node and layer (1: no overlap)");
ABSL_FLAG(int, attention_min_minibatch_rows, strata::RemoteAttentionOptions().min_minibatch_rows,
          "Disaggregated mode: rows a mini-batch has at least (a smaller share goes whole)");
ABSL_FLAG(strata::PrefillPolicy, prefill_attention, strata::RemoteAttentionOptions().prefill_policy,
          "Disaggregated mode: where prefill chunks attend to themselves: split (here, the "
          "cached prefix on the memory node) or memory (all on the memory node)");
ABSL_FLAG(int64_t, attention_timeout_ms,
          absl::ToInt64Milliseconds(strata::RemoteAttentionOptions().layer_timeout),
          "Disaggregated mode: how long a layer waits for a memory node before declaring it hung "
          "(rotational pipelining: a slice waits twice that for its context)");
ABSL_FLAG(int64_t, attention_answer_spin_us,
          absl::ToInt64Microseconds(strata::RemoteAttentionOptions().answer_spin),
          "Disaggregated mode: how long the step thread polls the data plane for a layer's "
          "answers before it sleeps until they come (0: it sleeps at once)");
ABSL_FLAG(strata::Pipelining, pipelining, strata::Pipelining::kOff,
          "Batches in flight in disaggregated mode: off (one), or two (while one batch's "
          "attention is on the memory nodes, the other's GEMMs run; the scheduler needs "
          "--pipelining=two as well). Co-located attention always runs one. fixed (set on the "
          "scheduler) runs one batch here, as off does. rotational: this node is one replica "
          "of a rotation (the scheduler needs --pipelining=rotational and the same "
          "--rotation_batches)");
ABSL_FLAG(int, rotation_batches, 3,
          "Rotational pipelining: batch slots n (the rotation runs n batches on n - 1 replicas)");
ABSL_FLAG(std::string, context_address, "",
          "Rotational pipelining: where contexts from other replicas arrive, HOST:PORT "
          "(default: --host, any port); reported at registration");
ABSL_FLAG(bool, step_channel, true,
          "Take step plans over the data plane (a step channel at --step_address, reported at "
          "registration) as well as over the RunSteps gRPC stream; the scheduler picks");
ABSL_FLAG(std::string, step_address, "",
          "Where the step channel listens, HOST:PORT (default: --host, any port)");
ABSL_FLAG(int64_t, plan_spin_us, absl::ToInt64Microseconds(strata::StepChannelOptions().plan_spin),
          "How long the step thread, idle, takes plans off the step channel itself before it "
          "sleeps until the channel's transport thread wakes it with one (0: it sleeps at once)");
ABSL_FLAG(int, metrics_port, -1, "Prometheus /metrics port (-1: off, 0: any free port)");
ABSL_FLAG(bool, verify_checksums, true, "Verify the checksum of every data-plane frame");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  strata::ApplyMutexDeadlockDetectionFlag();
  strata::ApplyServiceThreadsFlag();
  strata::InstallShutdownHandlers();
  strata::SetLogTag(absl::GetFlag(FLAGS_name));
  if (absl::Status cpus = strata::ApplyCpusFlag(absl::GetFlag(FLAGS_threads)); !cpus.ok()) {
    LOG(ERROR) << "--cpus: " << cpus.message();
    return 2;
  }

  // The model directory's errors come before the secret's.
  if (auto config = strata::LoadModelConfig(absl::GetFlag(FLAGS_model)); !config.ok()) {
    LOG(ERROR) << "cannot load the model: " << config.status();
    return 1;
  }
  auto auth = strata::ClusterAuthFromFlags();
  if (!auth.ok()) {
    LOG(ERROR) << auth.status().message();
    return 2;
  }

  strata::ComputeNodeOptions options;
  options.lanes = absl::GetFlag(FLAGS_pipelining) == strata::Pipelining::kTwo ? 2 : 1;
  if (absl::GetFlag(FLAGS_pipelining) == strata::Pipelining::kRotational) {
    options.rotation_batches = absl::GetFlag(FLAGS_rotation_batches);
    if (options.rotation_batches < 3) {
      LOG(ERROR) << "--rotation_batches: rotational pipelining runs n >= 3 batches on n - 1 >= 2 "
                    "replicas, not "
                 << options.rotation_batches;
      return 2;
    }
    options.context_address = absl::GetFlag(FLAGS_context_address).empty()
                                  ? absl::StrCat(absl::GetFlag(FLAGS_host), ":0")
                                  : absl::GetFlag(FLAGS_context_address);
  }
  const std::unique_ptr<strata::TraceRecorder> trace =
      strata::TraceRecorderFromFlags(absl::GetFlag(FLAGS_name));
  options.trace = trace.get();
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  options.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  options.max_batch_rows = absl::GetFlag(FLAGS_max_batch_rows);
  options.local_kv_budget_bytes = absl::GetFlag(FLAGS_kv_budget_mib) << 20;
  options.prefault_kv = absl::GetFlag(FLAGS_prefault_kv);
  if (auto kv = strata::ParseKvCacheType(absl::GetFlag(FLAGS_kv_cache_dtype)); kv.ok()) {
    options.kv_cache_dtype = *kv;
  } else {
    LOG(ERROR) << "--kv_cache_dtype: " << kv.status().message();
    return 2;
  }
  // Co-located mode's disk tier (unused when the scheduler has memory nodes).
  auto disk = strata::KvDiskOptionsFromFlags();
  if (!disk.ok()) {
    LOG(ERROR) << disk.status().message();
    return 2;
  }
  options.disk = *std::move(disk);
  options.remote.transport = strata::transport::TransportConfigFromFlags();
  options.remote.transport.auth_key = (*auth)->data_plane_key();
  options.remote.minibatches = absl::GetFlag(FLAGS_attention_minibatches);
  options.remote.min_minibatch_rows = absl::GetFlag(FLAGS_attention_min_minibatch_rows);
  options.remote.prefill_policy = absl::GetFlag(FLAGS_prefill_attention);
  options.remote.layer_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_attention_timeout_ms));
  options.remote.answer_spin = absl::Microseconds(absl::GetFlag(FLAGS_attention_answer_spin_us));
  options.handoff_timeout = strata::HandoffTimeout(options.remote.layer_timeout);
  options.remote.verify_checksums = absl::GetFlag(FLAGS_verify_checksums);
  auto registry = std::make_shared<strata::metrics::MetricsRegistry>();
  strata::ComputeNodeMetrics node_metrics(registry, absl::GetFlag(FLAGS_name));
  options.on_step = [&node_metrics](const strata::StepResult& r) { node_metrics.OnStep(r); };
  options.remote.on_layer_round_trip = [&node_metrics](double s) {
    node_metrics.OnLayerRoundTrip(s);
  };
  // Before any layer is built: the GEMM choice is read once per process.
  if (!absl::GetFlag(FLAGS_gemm).empty()) {
    setenv("STRATA_GEMM", absl::GetFlag(FLAGS_gemm).c_str(), 1);
  }
  if (auto gemm = strata::RequestedGemm(); !gemm.ok()) {
    LOG(ERROR) << "--gemm: " << gemm.status().message();
    return 2;
  }
  // Loading packs weights in parallel regions: on a thread of its own, so that their OpenMP
  // team does not outlive it (common/base/wait_policy.h).
  auto node =
      strata::OnOwnOpenMpThread([&options] { return strata::ComputeNode::Create(options); });
  if (!node.ok()) {
    LOG(ERROR) << "cannot load the model: " << node.status();
    return 1;
  }
  node_metrics.Attach(node->get());
  if ((*node)->disk().enabled()) {
    strata::RegisterKvDiskMetrics(*registry, absl::GetFlag(FLAGS_name), &(*node)->disk());
  }
  strata::NodeProcess process;
  process.host = absl::GetFlag(FLAGS_host);
  process.port = absl::GetFlag(FLAGS_port);
  process.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  process.scheduler = absl::GetFlag(FLAGS_scheduler);
  process.max_message_bytes = 256 << 20;  // step plans and results of large batches
  process.auth = *auth;
  process.registry = registry;
  process.info = strata::MakeNodeInfo(strata::control::ROLE_COMPUTE, absl::GetFlag(FLAGS_name),
                                      strata::kernels::CpuIsaName(strata::kernels::ActiveCpuIsa()));
  // What this node's kernels compute, which the scheduler compares with the other nodes'
  // (server/kernel_agreement.h): attention, every kernel, and the linear layers' GEMM,
  // which may be oneDNN's, whose kernels depend on the CPU (linear.h). On a thread of its
  // own, so that the kernels' OpenMP team does not outlive it.
  const auto [fingerprints, linear] = strata::OnOwnOpenMpThread([] {
    return std::make_pair(strata::kernels::FingerprintsForRegistration(),
                          strata::LinearFingerprint());
  });
  LOG(INFO) << "kernels: " << strata::kernels::CpuIsaName(strata::kernels::ActiveCpuIsa())
            << ", GEMM of wide batches: "
            << strata::kernels::GemmWideKernelName(strata::kernels::ActiveGemmWideKernel());
  process.info.set_attention_fingerprint(fingerprints.attention);
  process.info.set_kernel_fingerprint(absl::StrCat(fingerprints.all, "-", linear));
  process.info.set_kv_budget_bytes(options.local_kv_budget_bytes);
  *process.info.mutable_model() = strata::ToProto((*node)->shape());
  process.info.set_data_address((*node)->context_address());  // rotational: contexts arrive there
  // The step channel: the same plans as RunSteps, with fewer threads between them
  // (step_channel.h). Its sessions' steps run as RunSteps' do, on a thread of their own.
  std::unique_ptr<strata::StepChannel> step_channel;
  if (absl::GetFlag(FLAGS_step_channel)) {
    strata::StepChannelOptions channel;
    channel.transport = strata::transport::StepChannelConfigFromFlags();
    channel.transport.auth_key = (*auth)->data_plane_key();
    channel.listen_address = absl::GetFlag(FLAGS_step_address).empty()
                                 ? absl::StrCat(absl::GetFlag(FLAGS_host), ":0")
                                 : absl::GetFlag(FLAGS_step_address);
    channel.plan_spin = absl::Microseconds(absl::GetFlag(FLAGS_plan_spin_us));
    strata::ComputeNode* compute = node->get();
    channel.prepare = [compute](strata::PlanQueue& queue) { compute->PrepareQueue(queue); };
    const int threads = omp_get_max_threads();
    channel.run = [compute, threads, &node_metrics](strata::PlanQueue& queue) {
      strata::OnOwnOpenMpThread(
          [&] {
            strata::SetCurrentThreadName("step");
            compute->RunPipelined(queue, [&node_metrics](double s) { node_metrics.OnPlanWait(s); });
          },
          threads);
    };
    auto created = strata::StepChannel::Create(std::move(channel));
    if (!created.ok()) {
      LOG(ERROR) << "cannot open the step channel: " << created.status();
      return 1;
    }
    step_channel = std::move(*created);
    node_metrics.AttachStepChannel(step_channel.get());  // scrapes end with ServeNode
    process.info.set_step_address(step_channel->address());
    LOG(INFO) << "step channel at " << step_channel->address();
  }
  strata::ComputeNodeService service(node->get(), process.info, *auth);
  service.SetPlanWaitObserver([&node_metrics](double s) { node_metrics.OnPlanWait(s); });
  process.service = &service;
  process.status = [&] { return strata::ToProto((*node)->Status()); };
  process.description = absl::StrCat(", ", omp_get_max_threads(), " threads");
  const int rc = strata::ServeNode(std::move(process));
  strata::WriteTraceFromFlags(trace.get());
  return rc;
}
