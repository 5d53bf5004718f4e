// Command-line flags that choose the data-plane transport, shared by the compute node and
// the memory node:
//   --transport=ucx|inproc          backend
//   --ucx_tls=tcp                   UCX transports (UCX_TLS; empty: the environment's)
//   --ucx_net_devices=lo            UCX network devices (UCX_NET_DEVICES)
//   --transport_error_mode=peer     "peer" detects dead peers (needs tcp or IB), "none"
//                                   allows shared memory
#ifndef STRATA_COMMON_TRANSPORT_TRANSPORT_FLAGS_H_
#define STRATA_COMMON_TRANSPORT_TRANSPORT_FLAGS_H_

#include "common/transport/transport.h"

namespace strata::transport {

TransportConfig TransportConfigFromFlags();

}  // namespace strata::transport

#endif  // STRATA_COMMON_TRANSPORT_TRANSPORT_FLAGS_H_
