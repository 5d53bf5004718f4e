// Attention offloading benchmark (prints figures; no assertion). This process is the
// compute node; memory nodes are real memory_node processes that it starts, configures by
// RPC and reaches over the data plane.
//
//   --mode=breakdown  the decode step of the demo shape at several batch sizes, co-located
//                     against memory nodes over UCX shared memory: GEMM time, attention
//                     time, transport time, and bytes on the wire per token and layer
//                     against the theoretical minimum (q, k, v out; the output back).
//   --mode=overlap    one memory node in a network namespace behind a veth shaped by
//                     tc tbf, processes pinned to separate cores with taskset: step time
//                     with 1, 2 and 4 mini-batches per layer at several link rates.
//                     Needs root (namespaces); says so otherwise.
//
//   bazel build -c opt //compute_node/bench:offload_bench //memory_node:memory_node
//   bazel-bin/compute_node/bench/offload_bench --mode=breakdown --batches=1,8,32,64
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <omp.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/cpu_affinity.h"
#include "common/base/stopwatch.h"
#include "common/base/wait_policy.h"
#include "common/bench/demo_model.h"
#include "common/bench/int_list.h"
#include "common/bench/read_probe.h"
#include "common/process/supervisor.h"
#include "compute_node/attention_backend.h"
#include "compute_node/bench/filled_attention.h"
#include "compute_node/bench/memory_nodes.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/remote_attention.h"
#include "proto/control.grpc.pb.h"
#include "tests/common/netns.h"

ABSL_FLAG(std::string, mode, "breakdown", "breakdown or overlap");
ABSL_FLAG(std::string, model, "", "Model directory (default: the demo shape in /tmp)");
ABSL_FLAG(std::string, batches, "1,8,32,64", "Batch sizes (breakdown)");
ABSL_FLAG(int, ctx, 256, "Context of every sequence");
ABSL_FLAG(int, memory_nodes, 2, "Memory nodes (breakdown)");
ABSL_FLAG(std::string, memory_cpus, "",
          "Cores the pinned memory nodes split among them, as a cpuset list (empty: this "
          "process's; breakdown)");
ABSL_FLAG(std::string, compute_cpus, "",
          "Cores the compute side's main thread, and the threads it starts from then on, keep "
          "once the memory nodes have started, as a cpuset list (empty: all); the OpenMP team "
          "started while loading keeps every core, so partition with OMP_NUM_THREADS=1 "
          "(breakdown)");
ABSL_FLAG(bool, pin_memory_nodes, true,
          "Each memory node on its own cores, as the launcher starts them (breakdown)");
ABSL_FLAG(int64_t, eager_max_bytes, -1,
          "UCX eager limit on both sides (-1: the transport's default; 0: UCX's own choice)");
ABSL_FLAG(int, minibatches, 2, "Mini-batches per memory node and layer (breakdown)");
ABSL_FLAG(int, min_minibatch_rows, 16, "Rows a mini-batch needs at least");
ABSL_FLAG(int64_t, answer_spin_us,
          absl::ToInt64Microseconds(strata::RemoteAttentionOptions().answer_spin),
          "How long the step thread polls the data plane for a layer's answers before it "
          "sleeps (breakdown)");
ABSL_FLAG(std::string, tls, "sm,self,tcp", "UCX transports for the data plane (breakdown)");
ABSL_FLAG(int, iters, 8, "Timed steps per round");
ABSL_FLAG(int, rounds, 5, "Interleaved rounds per configuration");
ABSL_FLAG(bool, rounds_on_stdin, false,
          "Breakdown, first batch size only: after set-up, run one round of offloaded steps "
          "(warm-up steps, then --iters timed ones) for each line read from stdin, and print "
          "its median step as `offload_ms X`, until stdin ends; for a driver that pairs each "
          "round with another measurement taken right beside it (step_loop_bench.py --pairs)");
ABSL_FLAG(int, warmup_steps, 2, "Untimed steps of each mode before its timed ones, every round");
ABSL_FLAG(std::string, rates_mbit, "1000,2500,10000", "Link rates (overlap)");
ABSL_FLAG(std::string, overlap_minibatches, "1,2,4", "Mini-batch counts (overlap)");
ABSL_FLAG(int, overlap_batch, 32, "Batch (overlap)");
ABSL_FLAG(std::string, memory_node_bin, "", "memory_node binary (default: next to bazel-bin)");

namespace strata {
namespace {

using bench::NoAttention;

// Runs decode steps of `batch` sequences at context `ctx` over `attention`; returns the
// per-step times. Sequence b lives in pool b % pools. `setup` is called once.
struct StepRunner {
  const ModelWeights* weights;
  ModelRunner* runner;
  int batch, ctx, pools;
  std::unique_ptr<BatchBuffers> buffers;
  std::vector<int32_t> tokens;

  StepKvPlan Setup() const {
    StepKvPlan setup;
    setup.step_id = 1;
    const int length = ctx + 64;
    for (int b = 0; b < batch; ++b) {
      SlotAssignment a;
      a.request_id = SequenceId(b + 1);
      a.pool = PoolIndex(b % pools);
      for (int p = 0; p < length; ++p) a.slots.push_back((b / pools) * length + p);
      setup.assignments.push_back(a);
    }
    return setup;
  }
  // One decode step at position ctx + (i % 4); rows grouped by pool.
  StepKvPlan Step(uint64_t id, int i) const {
    StepKvPlan plan;
    plan.step_id = id;
    for (int pool = 0; pool < pools; ++pool) {
      for (int b = pool; b < batch; b += pools) {
        plan.rows.push_back({SequenceId(b + 1), PoolIndex(pool), ctx + (i % 4), -1});
      }
    }
    return plan;
  }
  double Run(AttentionBackend& attention, uint64_t step_id, int i, AttentionStepOutcome* out) {
    const Stopwatch watch;
    const StepKvPlan plan = Step(step_id, i);
    if (!ForwardLayers(*runner, attention, *buffers, plan, tokens.data()).ok()) std::abort();
    std::vector<int32_t> rows(batch);
    for (int b = 0; b < batch; ++b) rows[b] = b;
    std::vector<float> logits(RowsCapacity(batch) * weights->config.vocab_size);
    runner->Logits(*buffers, rows, logits.data());
    AttentionStepOutcome outcome = attention.EndStep();
    if (!outcome.failed.empty()) {
      // A step that lost rows did less work: its time would flatter the figures.
      std::fprintf(stderr, "step %llu lost %zu request(s), first: %s\n",
                   static_cast<unsigned long long>(step_id), outcome.failed.size(),
                   std::string(outcome.failed.front().second.message()).c_str());
      std::exit(1);
    }
    if (out != nullptr) *out = outcome;
    return watch.ElapsedSeconds();
  }
};

int Breakdown(const ModelWeights& weights, const std::string& memory_bin) {
  const ModelConfig& c = weights.config;
  const int n_mem = absl::GetFlag(FLAGS_memory_nodes);
  const int ctx = absl::GetFlag(FLAGS_ctx);
  const int iters = absl::GetFlag(FLAGS_iters);
  const std::vector<int> batches = ParseIntList(absl::GetFlag(FLAGS_batches));
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int64_t slots = static_cast<int64_t>((max_batch + n_mem - 1) / n_mem + 1) * (ctx + 64);
  std::vector<int> memory_cpus;
  if (!absl::GetFlag(FLAGS_memory_cpus).empty()) {
    auto parsed = ParseCpuList(absl::GetFlag(FLAGS_memory_cpus));
    if (!parsed.ok()) {
      std::fprintf(stderr, "--memory_cpus: %s\n", std::string(parsed.status().message()).c_str());
      return 1;
    }
    memory_cpus = *parsed;
  }
  Supervisor supervisor;
  auto started = bench::StartMemoryNodes(
      supervisor, memory_bin, n_mem, absl::GetFlag(FLAGS_tls),
      absl::GetFlag(FLAGS_pin_memory_nodes), c, slots,
      {absl::StrCat("--ucx_eager_max_bytes=", absl::GetFlag(FLAGS_eager_max_bytes))}, memory_cpus);
  if (!started.ok()) {
    std::fprintf(stderr, "%s\n", std::string(started.status().message()).c_str());
    return 1;
  }
  const std::vector<bench::StartedMemoryNode>& nodes = *started;
  // The memory nodes were started with this process's cores to choose from; now the compute
  // side leaves them theirs (threads started from here on, the data plane's included).
  if (!absl::GetFlag(FLAGS_compute_cpus).empty()) {
    if (absl::Status pinned = PinProcessToCpus(absl::GetFlag(FLAGS_compute_cpus)); !pinned.ok()) {
      std::fprintf(stderr, "--compute_cpus: %s\n", std::string(pinned.message()).c_str());
      return 1;
    }
  }
  RemoteAttentionOptions options;
  options.transport.ucx_options = {{"TLS", absl::GetFlag(FLAGS_tls)}, {"NET_DEVICES", "lo"}};
  options.transport.error_mode = transport::ErrorMode::kNone;
  options.transport.eager_max_bytes = absl::GetFlag(FLAGS_eager_max_bytes);
  options.transport.auth_key = bench::BenchAuth()->data_plane_key();
  options.minibatches = absl::GetFlag(FLAGS_minibatches);
  options.min_minibatch_rows = absl::GetFlag(FLAGS_min_minibatch_rows);
  options.answer_spin = absl::Microseconds(absl::GetFlag(FLAGS_answer_spin_us));
  auto remote = RemoteAttention::Create(c, options);
  if (!remote.ok()) return 1;
  (*remote)->SetMemoryNodes(1, bench::Addresses(nodes));

  const size_t q_row = c.q_size() * 2, kv_row = c.kv_size() * 2;
  std::printf(
      "offload breakdown: demo shape, ctx %d, %d memory node(s) %s over UCX %s, up to %d "
      "mini-batch(es) of >= %d rows, %d compute thread(s); medians of %d rounds x %d steps "
      "(after %d warm-up steps)\n",
      ctx, n_mem, absl::GetFlag(FLAGS_pin_memory_nodes) ? "on their own cores" : "unpinned",
      absl::GetFlag(FLAGS_tls).c_str(), options.minibatches, options.min_minibatch_rows,
      omp_get_max_threads(), absl::GetFlag(FLAGS_rounds), iters, absl::GetFlag(FLAGS_warmup_steps));
  std::printf(
      "theoretical minimum per token and layer: %zu bytes out (q %zu + k %zu + v %zu), "
      "%zu back; plus a %zu-byte header per frame\n",
      q_row + 2 * kv_row, q_row, kv_row, kv_row, q_row, sizeof(transport::FrameHeader));
  std::printf("%6s %9s %9s %6s %8s %9s %8s %9s %9s %8s %12s %12s\n", "batch", "coloc_ms",
              "offload_ms", "ratio", "gemm_ms", "local_att", "wait_ms", "mem_att", "xport_ms",
              "frame_ms", "out_B/tok/L", "back_B/tok/L");
  uint64_t step_id = 10;
  for (int batch : batches) {
    ModelRunner runner(&weights, ctx + 128);
    StepRunner sr{&weights,
                  &runner,
                  batch,
                  ctx,
                  n_mem,
                  std::make_unique<BatchBuffers>(c, batch),
                  std::vector<int32_t>(batch, 100)};
    StepRunner local_sr{&weights,
                        &runner,
                        batch,
                        ctx,
                        1,
                        std::make_unique<BatchBuffers>(c, batch),
                        std::vector<int32_t>(batch, 100)};
    auto local = LocalAttention::Create(c, static_cast<int64_t>(batch) * (ctx + 64), true);
    if (!local.ok() || !(*local)->BeginStep(local_sr.Setup()).ok()) return 1;
    StepKvPlan setup = sr.Setup();
    setup.step_id = step_id++;
    if (!(*remote)->BeginStep(setup).ok()) return 1;
    (*remote)->EndStep();
    if (absl::GetFlag(FLAGS_rounds_on_stdin)) {
      std::printf("ready\n");
      std::fflush(stdout);
      for (std::string line; std::getline(std::cin, line);) {
        for (int i = 0; i < absl::GetFlag(FLAGS_warmup_steps); ++i) {
          sr.Run(**remote, step_id++, i, nullptr);
        }
        std::vector<double> steps;
        for (int i = 0; i < iters; ++i) steps.push_back(sr.Run(**remote, step_id++, i, nullptr));
        std::printf("offload_ms %.4f\n", Median(steps) * 1e3);
        std::fflush(stdout);
      }
      break;
    }
    NoAttention none;
    std::vector<double> coloc, offload, gemm, wait, mem_attention, out_bytes, back_bytes, sends,
        merges;
    // Each mode gets warm-up steps in every round before it is timed: steps run back to back
    // when serving, while here each mode waits idle while the other two run.
    const int warmup = absl::GetFlag(FLAGS_warmup_steps);
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      for (int i = 0; i < warmup; ++i) local_sr.Run(**local, step_id++, i, nullptr);
      for (int i = 0; i < iters; ++i) coloc.push_back(local_sr.Run(**local, step_id++, i, nullptr));
      for (int i = 0; i < warmup; ++i) sr.Run(**remote, step_id++, i, nullptr);
      std::vector<uint64_t> before;
      for (const auto& n : nodes)
        before.push_back(bench::MemoryNodeStatus(n.control).attention_us());
      for (int i = 0; i < iters; ++i) {
        AttentionStepOutcome outcome;
        offload.push_back(sr.Run(**remote, step_id++, i, &outcome));
        wait.push_back(outcome.wait_us / 1e6);
        sends.push_back(outcome.send_us / 1e6);
        merges.push_back(outcome.merge_us / 1e6);
        out_bytes.push_back(outcome.bytes_sent / static_cast<double>(batch * c.num_layers));
        back_bytes.push_back(outcome.bytes_received / static_cast<double>(batch * c.num_layers));
      }
      double node_max = 0;
      for (size_t k = 0; k < nodes.size(); ++k) {
        node_max = std::max(
            node_max,
            (bench::MemoryNodeStatus(nodes[k].control).attention_us() - before[k]) / 1e6 / iters);
      }
      mem_attention.push_back(node_max);
      for (int i = 0; i < warmup; ++i) sr.Run(none, step_id++, i, nullptr);
      for (int i = 0; i < iters; ++i) gemm.push_back(sr.Run(none, step_id++, i, nullptr));
    }
    const double co = Median(coloc), off = Median(offload), g = Median(gemm), w = Median(wait),
                 ma = Median(mem_attention);
    std::printf("%6d %9.2f %9.2f %6.2f %8.2f %9.2f %8.2f %9.2f %9.2f %8.2f %12.1f %12.1f\n", batch,
                co * 1e3, off * 1e3, off / co, g * 1e3, (co - g) * 1e3, w * 1e3, ma * 1e3,
                std::max(0.0, w - ma) * 1e3, (Median(sends) + Median(merges)) * 1e3,
                Median(out_bytes), Median(back_bytes));
    std::fflush(stdout);
  }
  std::printf(
      "wait_ms: time the compute node waited for memory nodes per step; mem_att: attention "
      "time of the busiest memory node per step; xport_ms: the rest of the wait (transfers, "
      "wake-ups, the memory nodes' framing); frame_ms: this node's framing (checksums, "
      "posting sends, placing answers), as wall time on the step thread, which includes time "
      "the kernel gave its core to a memory node that had just been woken. Bytes per token and "
      "layer include the frame headers and the step descriptor, spread over the step's "
      "tokens.\n");
  supervisor.StopAll(absl::Seconds(5));
  return 0;
}

int Overlap(const ModelWeights& weights, const std::string& memory_bin) {
  const ModelConfig& c = weights.config;
  auto hosts = testing::NetnsHosts::Create("ob", 1);
  if (!hosts.ok()) {
    std::printf("overlap mode needs network namespaces (root): %s\n",
                std::string(hosts.status().message()).c_str());
    return 0;
  }
  const int ctx = absl::GetFlag(FLAGS_ctx);
  const int batch = absl::GetFlag(FLAGS_overlap_batch);
  const int iters = absl::GetFlag(FLAGS_iters);
  // Pin: this process (the compute node) on core 0, the memory node on core 1.
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  sched_setaffinity(0, sizeof(set), &set);
  omp_set_num_threads(1);
  const int port = 30000 + getpid() % 20000;
  const std::string address = (*hosts)->Address(1);
  const pid_t node = (*hosts)->Spawn(
      1,
      {"/usr/bin/taskset", "-c", "1", memory_bin, "--scheduler=", absl::StrCat("--port=", port),
       "--host=" + address, "--name=memory-0", "--ucx_tls=tcp", "--ucx_net_devices=eth0",
       "--transport_error_mode=peer", "--threads=1", bench::ClusterSecretFlag()},
      // Core 1 is the memory node's alone; this process keeps core 0.
      OpenMpEnvironmentList(1, CoreShare::kDedicated));
  auto configured = bench::ConfigureMemoryNode(absl::StrCat(address, ":", port), 0, c,
                                               static_cast<int64_t>(batch) * (ctx + 64));
  if (!configured.ok()) {
    std::printf("memory node: %s\n", std::string(configured.status().message()).c_str());
    kill(node, SIGKILL);
    return 1;
  }
  std::printf(
      "overlap: demo shape, batch %d, ctx %d, one memory node in a namespace, compute "
      "and memory pinned to one core each; median step ms over %d rounds x %d steps\n",
      batch, ctx, absl::GetFlag(FLAGS_rounds), iters);
  std::printf("%10s", "link");
  for (int mb : ParseIntList(absl::GetFlag(FLAGS_overlap_minibatches))) {
    std::printf(" %9s", absl::StrCat(mb, "_mb").c_str());
  }
  std::printf(" %12s\n", "best_vs_1mb");
  ModelRunner runner(&weights, ctx + 128);
  for (int rate : ParseIntList(absl::GetFlag(FLAGS_rates_mbit))) {
    if (!(*hosts)->Shape(1, rate).ok() || !(*hosts)->ShapeOwn(rate).ok()) return 1;
    std::printf("%7d Mb", rate);
    double first = 0, best = 1e30;
    for (int mb : ParseIntList(absl::GetFlag(FLAGS_overlap_minibatches))) {
      RemoteAttentionOptions options;
      options.transport.ucx_options = {{"TLS", "tcp"}, {"NET_DEVICES", (*hosts)->OwnDevice()}};
      options.transport.auth_key = bench::BenchAuth()->data_plane_key();
      options.minibatches = mb;
      options.min_minibatch_rows = 1;
      auto remote = RemoteAttention::Create(c, options);
      if (!remote.ok()) return 1;
      (*remote)->SetMemoryNodes(1, {{PoolIndex(0), "memory-0", configured->data}});
      StepRunner sr{&weights,
                    &runner,
                    batch,
                    ctx,
                    1,
                    std::make_unique<BatchBuffers>(c, batch),
                    std::vector<int32_t>(batch, 100)};
      StepKvPlan setup = sr.Setup();
      setup.step_id = 1;
      if (!(*remote)->BeginStep(setup).ok()) return 1;
      (*remote)->EndStep();
      sr.Run(**remote, 2, 0, nullptr);
      std::vector<double> steps;
      uint64_t id = 3;
      for (int i = 0; i < iters * absl::GetFlag(FLAGS_rounds); ++i) {
        steps.push_back(sr.Run(**remote, id++, i, nullptr));
      }
      const double m = Median(steps);
      if (first == 0) first = m;
      best = std::min(best, m);
      std::printf(" %9.2f", m * 1e3);
      std::fflush(stdout);
    }
    std::printf(" %12.2f\n", best / first);
  }
  (void)(*hosts)->Shape(1, 0);
  (void)(*hosts)->ShapeOwn(0);
  kill(node, SIGTERM);
  return 0;
}

int Run() {
  absl::StatusOr<std::string> model_dir = BenchModelDir(absl::GetFlag(FLAGS_model));
  if (!model_dir.ok()) {
    std::fprintf(stderr, "%s\n", model_dir.status().ToString().c_str());
    return 1;
  }
  const std::string& dir = *model_dir;
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return 1;
  auto weights = ModelWeights::Load(dir, *config);
  if (!weights.ok()) return 1;
  const std::string memory_bin = absl::GetFlag(FLAGS_memory_node_bin).empty()
                                     ? bench::MemoryNodeBinary()
                                     : absl::GetFlag(FLAGS_memory_node_bin);
  if (!std::filesystem::exists(memory_bin)) {
    std::fprintf(stderr, "no memory_node binary at %s (build //memory_node:memory_node)\n",
                 memory_bin.c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_mode) == "overlap") return Overlap(**weights, memory_bin);
  return Breakdown(**weights, memory_bin);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
