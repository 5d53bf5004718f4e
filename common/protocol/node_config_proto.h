// Conversions between the node configuration structs (node_config.h) and their protos in
// proto/control.proto, for the nodes' gRPC edges.
#ifndef STRATA_COMMON_PROTOCOL_NODE_CONFIG_PROTO_H_
#define STRATA_COMMON_PROTOCOL_NODE_CONFIG_PROTO_H_

#include "absl/status/statusor.h"
#include "common/protocol/node_config.h"
#include "proto/control.pb.h"

namespace strata {

control::ModelShape ToProto(const ModelShape& shape);
ModelShape FromProto(const control::ModelShape& in);

control::NodeStatus ToProto(const NodeStatus& status);

MemoryConfig FromProto(const control::MemoryConfig& in);
control::MemoryConfigAck ToProto(const MemoryConfigAck& ack);
control::KvMove ToProto(const KvMove& move);
// InvalidArgument for an unknown kind.
absl::StatusOr<KvMove> FromProto(const control::KvMove& in);
// Every move of a batch; the first malformed one is the error.
absl::StatusOr<std::vector<KvMove>> MovesFromProto(const control::KvMoves& in);

ComputeConfig FromProto(const control::ComputeConfig& in);
control::ComputeConfigAck ToProto(const ComputeConfigAck& ack);

}  // namespace strata

#endif  // STRATA_COMMON_PROTOCOL_NODE_CONFIG_PROTO_H_
