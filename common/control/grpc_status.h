// The one conversion between absl::Status and grpc::Status. gRPC's codes are absl's codes
// (both are google.rpc.Code), so a code survives the hop both ways.
#ifndef STRATA_COMMON_CONTROL_GRPC_STATUS_H_
#define STRATA_COMMON_CONTROL_GRPC_STATUS_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"

namespace strata {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace strata

#endif  // STRATA_COMMON_CONTROL_GRPC_STATUS_H_
