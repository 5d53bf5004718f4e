// The in-process backend of Transport (transport.h), for tests: transports of one process
// connect by name ("inproc listen name") and exchange copies of messages through queues,
// each delivered on the receiving transport's own thread.
#ifndef STRATA_COMMON_TRANSPORT_INPROC_TRANSPORT_H_
#define STRATA_COMMON_TRANSPORT_INPROC_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"

namespace strata::transport {

absl::StatusOr<std::unique_ptr<Transport>> CreateInprocTransport(const TransportConfig& config);

}  // namespace strata::transport

#endif  // STRATA_COMMON_TRANSPORT_INPROC_TRANSPORT_H_
