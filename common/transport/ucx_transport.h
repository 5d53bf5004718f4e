// The UCX backend of Transport (transport.h). Private to common/transport.
#ifndef STRATA_COMMON_TRANSPORT_UCX_TRANSPORT_H_
#define STRATA_COMMON_TRANSPORT_UCX_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"

namespace strata::transport {

absl::StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const TransportConfig& config);

}  // namespace strata::transport

#endif  // STRATA_COMMON_TRANSPORT_UCX_TRANSPORT_H_
