// Conversions between the step structs (step.h) and proto/control.proto, used only at the
// gRPC edge. Decoding validates what a struct cannot express (sizes, ranges) and returns
// InvalidArgument for a malformed message.
#ifndef STRATA_COMMON_PROTOCOL_STEP_PROTO_H_
#define STRATA_COMMON_PROTOCOL_STEP_PROTO_H_

#include "absl/status/statusor.h"
#include "common/protocol/step.h"
#include "proto/control.pb.h"

namespace strata {

void ToProto(const StepPlan& plan, control::StepPlan* out);
absl::StatusOr<StepPlan> FromProto(const control::StepPlan& in);

void ToProto(const StepResult& result, control::StepResult* out);
StepResult FromProto(const control::StepResult& in);

void ToProto(const SamplingParams& p, control::SamplingParams* out);

// A status with its code. A code outside absl's becomes kUnknown, keeping the message.
void ToProto(const absl::Status& status, control::Status* out);
absl::Status FromProto(const control::Status& in);
SamplingParams FromProto(const control::SamplingParams& in);

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_STEP_PROTO_H_
