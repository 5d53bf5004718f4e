#include "tests/common/grpc_raw.h"

#include <grpcpp/generic/generic_stub.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata::testing {

RawCallResult RawGrpcCall(int port, const std::string& method, const std::string& bytes,
                          const std::function<void(grpc::ClientContext*)>& prepare) {
  grpc::GenericStub stub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (prepare) prepare(&context);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&context, method, &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer message(&slice, 1), reply;
  call->Write(message, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  call->Read(&reply, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  RawCallResult result;
  result.got_reply = ok;
  if (ok) {
    std::vector<grpc::Slice> slices;
    (void)reply.Dump(&slices);
    for (const grpc::Slice& s : slices) {
      result.reply.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  call->Finish(&result.status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return result;
}

}  // namespace strata::testing
