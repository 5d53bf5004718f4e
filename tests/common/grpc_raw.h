// Raw gRPC calls for tests that play a client built from proto/ (or a hostile one): any bytes
// as the request of any method, unary or streaming, on a server at 127.0.0.1:port.
#ifndef STRATA_TESTS_COMMON_GRPC_RAW_H_
#define STRATA_TESTS_COMMON_GRPC_RAW_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>

namespace strata::testing {

struct RawCallResult {
  grpc::Status status;
  bool got_reply = false;
  std::string reply;  // the first reply message's bytes
};

// Sends `bytes` as one message on `method` ("/package.Service/Method"), half-closes, reads
// the first reply and the call's status (10 s deadline). `prepare` may add metadata, such as
// the deployment's credentials.
RawCallResult RawGrpcCall(int port, const std::string& method, const std::string& bytes,
                          const std::function<void(grpc::ClientContext*)>& prepare = nullptr);

}  // namespace strata::testing

#endif  // STRATA_TESTS_COMMON_GRPC_RAW_H_
