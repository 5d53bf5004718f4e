// memory_node: holds KV cache and runs attention where it lives.
//
//   memory_node --scheduler=HOST:PORT [--name=memory-0] [--kv_budget_mib=4096]
//               [--data_address=HOST:0] [--ucx_tls=tcp] [--threads=N]
//               [--kv_disk_dir=DIR --kv_disk_budget_gib=N]
#include <omp.h>

#include <algorithm>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/base/cpu_affinity.h"
#include "common/base/cpu_flags.h"
#include "common/base/logging.h"
#include "common/base/mutex_flags.h"
#include "common/base/shutdown.h"
#include "common/base/trace_flags.h"
#include "common/base/wait_policy.h"
#include "common/control/cluster_flags.h"
#include "common/control/node_main.h"
#include "common/metrics/metrics.h"
#include "common/protocol/node_config_proto.h"
#include "common/transport/transport_flags.h"
#include "kernels/cpu/fingerprint.h"
#include "kernels/cpu/isa.h"
#include "memory_node/kv_disk_flags.h"
#include "memory_node/memory_server.h"
#include "memory_node/node_metrics.h"
#include "memory_node/service.h"

ABSL_FLAG(std::string, scheduler, "127.0.0.1:50050",
          "Scheduler control address (empty: standalone, configured by direct RPC, as "
          "benchmarks do)");
ABSL_FLAG(std::string, name, "memory-0", "Node name (logs, metrics)");
ABSL_FLAG(std::string, host, "127.0.0.1", "Control-plane listen address");
ABSL_FLAG(int, port, 0, "Control port (0: any free port)");
ABSL_FLAG(std::string, data_address, "",
          "Data-plane listen address, HOST:PORT (default: --host, any port)");
ABSL_FLAG(int, threads, 0,
          "Attention threads (0: OMP_NUM_THREADS, else the cores it may run on, fewer under "
          "a CPU quota)");
ABSL_FLAG(int64_t, kv_budget_mib, 4096, "KV cache budget, MiB");
ABSL_FLAG(bool, verify_checksums, true, "Verify the checksum of every data-plane frame");
ABSL_FLAG(int, metrics_port, -1, "Prometheus /metrics port (-1: off, 0: any free port)");
ABSL_FLAG(bool, prefault_kv, true, "Touch the KV cache when it is allocated");
ABSL_FLAG(int64_t, max_held_frames_mib, 0,
          "The most MiB of compute nodes' data-plane frames held here at once, all peers "
          "together (received, not yet answered); past it a frame is refused and its step "
          "fails. 0: 4 peers' budgets (each 8 of the largest layer frame, at least 64 MiB)");
int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  strata::ApplyMutexDeadlockDetectionFlag();
  strata::InstallShutdownHandlers();
  strata::SetLogTag(absl::GetFlag(FLAGS_name));
  if (absl::Status cpus = strata::ApplyCpusFlag(absl::GetFlag(FLAGS_threads)); !cpus.ok()) {
    LOG(ERROR) << "--cpus: " << cpus.message();
    return 2;
  }

  auto auth = strata::ClusterAuthFromFlags();
  if (!auth.ok()) {
    LOG(ERROR) << auth.status().message();
    return 2;
  }

  strata::MemoryServerOptions options;
  options.transport = strata::transport::TransportConfigFromFlags();
  options.transport.auth_key = (*auth)->data_plane_key();
  options.data_address = absl::GetFlag(FLAGS_data_address).empty()
                             ? absl::StrCat(absl::GetFlag(FLAGS_host), ":0")
                             : absl::GetFlag(FLAGS_data_address);
  options.verify_checksums = absl::GetFlag(FLAGS_verify_checksums);
  options.prefault_kv = absl::GetFlag(FLAGS_prefault_kv);
  if (absl::GetFlag(FLAGS_max_held_frames_mib) < 0) {
    LOG(ERROR) << "--max_held_frames_mib must be 0 (the default) or more";
    return 2;
  }
  options.max_held_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_held_frames_mib)) << 20;
  // Frames run inline on the transport thread only without an OpenMP team: with one, the
  // transport thread and the worker would each keep a team, and two teams throttle each
  // other's spin (common/base/wait_policy.h).
  options.run_on_transport_thread = omp_get_max_threads() == 1;
  auto disk = strata::KvDiskOptionsFromFlags();
  if (!disk.ok()) {
    LOG(ERROR) << disk.status().message();
    return 2;
  }
  options.disk = *std::move(disk);
  const std::unique_ptr<strata::TraceRecorder> trace =
      strata::TraceRecorderFromFlags(absl::GetFlag(FLAGS_name));
  options.trace = trace.get();
  auto server = strata::MemoryServer::Create(options);
  if (!server.ok()) {
    LOG(ERROR) << "cannot start the data plane: " << server.status();
    return 1;
  }

  auto registry = std::make_shared<strata::metrics::MetricsRegistry>();
  strata::RegisterMemoryNodeMetrics(*registry, absl::GetFlag(FLAGS_name), server->get());

  strata::NodeProcess process;
  process.host = absl::GetFlag(FLAGS_host);
  process.port = absl::GetFlag(FLAGS_port);
  process.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  process.scheduler = absl::GetFlag(FLAGS_scheduler);
  process.auth = *auth;
  process.registry = registry;
  process.info = strata::MakeNodeInfo(strata::control::ROLE_MEMORY, absl::GetFlag(FLAGS_name),
                                      strata::kernels::CpuIsaName(strata::kernels::ActiveCpuIsa()));
  // What this node's attention computes, which the scheduler compares with the other nodes'
  // (server/kernel_agreement.h); on a thread of its own, so that the kernels' OpenMP team
  // does not outlive it (common/base/wait_policy.h).
  process.info.set_attention_fingerprint(strata::OnOwnOpenMpThread([] {
                                           return strata::kernels::FingerprintsForRegistration();
                                         }).attention);
  process.info.set_kv_budget_bytes(absl::GetFlag(FLAGS_kv_budget_mib) << 20);
  process.info.set_data_address((*server)->data_address());
  process.info.set_transport((*server)->capabilities().ToString());
  strata::MemoryNodeService service(server->get(), process.info, *auth);
  process.service = &service;
  process.status = [&] { return strata::ToProto((*server)->Status()); };
  process.description = absl::StrCat(", ", omp_get_max_threads(), " threads on cores ",
                                     strata::FormatCpuList(strata::AllowedCpus()));
  const int rc = strata::ServeNode(std::move(process));
  strata::WriteTraceFromFlags(trace.get());
  return rc;
}
