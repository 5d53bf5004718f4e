// A gRPC service standing in for a node in a test: served on a free loopback port, with the
// credentials of the deployment's ClusterAuth, as a node serves its control service.
#ifndef STRATA_SERVER_TESTING_LOOPBACK_GRPC_H_
#define STRATA_SERVER_TESTING_LOOPBACK_GRPC_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/control/cluster_auth.h"

namespace strata::testing {

struct LoopbackServer {
  std::unique_ptr<grpc::Server> server;  // null if it could not start
  std::string address;                   // 127.0.0.1:PORT
};

inline LoopbackServer ServeOnLoopback(grpc::Service& service, const ClusterAuth& auth) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", auth.ServerCredentials(), &port);
  builder.RegisterService(&service);
  LoopbackServer out;
  out.server = builder.BuildAndStart();
  out.address = absl::StrCat("127.0.0.1:", port);
  return out;
}

}  // namespace strata::testing

#endif  // STRATA_SERVER_TESTING_LOOPBACK_GRPC_H_
