// Command-line flags that choose the data-plane transport, shared by the compute node, the
// memory node and the server (whose only data-plane traffic is the step channel):
//   --transport=ucx|inproc          backend
//   --ucx_tls=tcp                   UCX transports (UCX_TLS; empty: the environment's)
//   --ucx_net_devices=lo            UCX network devices (UCX_NET_DEVICES)
//   --transport_error_mode=peer     "peer": UCX detects dead peers (needs tcp or IB);
//                                   "none" allows shared memory (the liveness sockets
//                                   find its dead peers, ucx_bootstrap.h)
//   --step_channel_ucx_tls=tcp      UCX transports of the step channel between the
//                                   scheduler and a compute node (error mode none where
//                                   they name shared memory, else peer)
#ifndef STRATA_COMMON_TRANSPORT_TRANSPORT_FLAGS_H_
#define STRATA_COMMON_TRANSPORT_TRANSPORT_FLAGS_H_

#include "common/transport/transport.h"

namespace strata::transport {

TransportConfig TransportConfigFromFlags();
// The step channel's (compute_node/step_channel.h): the flags' transport with
// --step_channel_ucx_tls's transports, and the error mode those need.
TransportConfig StepChannelConfigFromFlags();

}  // namespace strata::transport

#endif  // STRATA_COMMON_TRANSPORT_TRANSPORT_FLAGS_H_
