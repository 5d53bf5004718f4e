#include "common/transport/transport_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(strata::transport::Backend, transport, strata::transport::TransportConfig().backend,
          "Data-plane transport: ucx or inproc");
ABSL_FLAG(std::string, ucx_tls, "",
          "UCX transports, as UCX_TLS (e.g. tcp, or sm,self,tcp); empty: the environment's");
ABSL_FLAG(std::string, ucx_net_devices, "", "UCX network devices, as UCX_NET_DEVICES");
ABSL_FLAG(int64_t, ucx_eager_max_bytes, -1,
          "Messages up to this size go eagerly, never by rendezvous (-1: 256 KiB when "
          "--ucx_tls names shared memory, else UCX's choice; 0: UCX's choice)");
ABSL_FLAG(strata::transport::ErrorMode, transport_error_mode,
          strata::transport::TransportConfig().error_mode,
          "peer: UCX detects dead peers (tcp, InfiniBand); none: allows UCX shared memory, "
          "whose dead peers each connection's liveness socket finds");
ABSL_FLAG(std::string, step_channel_ucx_tls, "tcp",
          "UCX transports of the step channel between the scheduler and compute nodes (e.g. "
          "tcp, rc on InfiniBand, or sm,self,tcp on one host)");

namespace strata::transport {

TransportConfig TransportConfigFromFlags() {
  TransportConfig config;
  config.backend = absl::GetFlag(FLAGS_transport);
  config.error_mode = absl::GetFlag(FLAGS_transport_error_mode);
  config.eager_max_bytes = absl::GetFlag(FLAGS_ucx_eager_max_bytes);
  if (!absl::GetFlag(FLAGS_ucx_tls).empty())
    config.ucx_options["TLS"] = absl::GetFlag(FLAGS_ucx_tls);
  if (!absl::GetFlag(FLAGS_ucx_net_devices).empty()) {
    config.ucx_options["NET_DEVICES"] = absl::GetFlag(FLAGS_ucx_net_devices);
  }
  return config;
}

TransportConfig StepChannelConfigFromFlags() {
  TransportConfig config = TransportConfigFromFlags();
  if (!absl::GetFlag(FLAGS_step_channel_ucx_tls).empty()) {
    config.ucx_options["TLS"] = absl::GetFlag(FLAGS_step_channel_ucx_tls);
  }
  // A dead compute node must fail its plans at once: UCX finds it itself over tcp or verbs
  // (error mode peer); over shared memory, which needs error mode none, the connection's
  // liveness socket does.
  auto tls = config.ucx_options.find("TLS");
  config.error_mode = tls != config.ucx_options.end() && UcxTlsNamesSharedMemory(tls->second)
                          ? ErrorMode::kNone
                          : ErrorMode::kPeer;
  return config;
}

}  // namespace strata::transport
