// The node configuration structs against their protos: every proto field is carried, so a
// field added to proto/control.proto without its conversion fails here.
#include "common/protocol/node_config_proto.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>
#include <google/protobuf/util/message_differencer.h>

#include "gtest/gtest.h"

namespace strata {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Sets every singular scalar field of `m` (not nested messages) to a distinct non-default
// value.
void FillScalars(Message* m, int seed) {
  const auto* d = m->GetDescriptor();
  const auto* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    const int v = seed + i + 1;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(m, f, v);
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(m, f, v);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(m, f, v);
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(m, f, v);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(m, f, true);
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(m, f, "s" + std::to_string(v));
        break;
      default:
        break;
    }
  }
}

// The names of the fields of `m` that hold their default value.
std::vector<std::string> UnsetFields(const Message& m) {
  std::vector<std::string> unset;
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const bool set = f->is_repeated() ? r->FieldSize(m, f) > 0 : r->HasField(m, f);
    if (!set) unset.push_back(f->name());
  }
  return unset;
}

TEST(NodeConfigProtoTest, ModelShapeRoundTripsEveryField) {
  control::ModelShape in;
  FillScalars(&in, 10);
  EXPECT_TRUE(UnsetFields(in).empty());
  const control::ModelShape out = ToProto(FromProto(in));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(in, out))
      << in.DebugString() << "\nvs\n"
      << out.DebugString();
}

TEST(NodeConfigProtoTest, NodeStatusCarriesEveryField) {
  NodeStatus status{true, 2, 3, 4, "error", 5, 6, 7, 8, 9, 10};
  const control::NodeStatus out = ToProto(status);
  const std::vector<std::string> unset = UnsetFields(out);
  EXPECT_TRUE(unset.empty()) << "not converted: " << unset.front();
  EXPECT_TRUE(out.ready());
  EXPECT_EQ(out.kv_slots_total(), 2u);
  EXPECT_EQ(out.kv_slots_in_tables(), 3u);
  EXPECT_EQ(out.steps_executed(), 4u);
  EXPECT_EQ(out.error(), "error");
  EXPECT_EQ(out.attention_us(), 5u);
  EXPECT_EQ(out.layer_frames(), 6u);
  EXPECT_EQ(out.bytes_received(), 7u);
  EXPECT_EQ(out.bytes_sent(), 8u);
  EXPECT_EQ(out.checksum_failures(), 9u);
  EXPECT_EQ(out.malformed_frames(), 10u);
}

TEST(NodeConfigProtoTest, MemoryConfigFromProto) {
  control::MemoryConfig in;
  FillScalars(&in, 100);
  FillScalars(in.mutable_model(), 200);
  EXPECT_TRUE(UnsetFields(in).empty());
  const MemoryConfig out = FromProto(in);
  EXPECT_EQ(out.epoch, in.epoch());
  EXPECT_EQ(out.pool, PoolIndex(in.pool_index()));
  EXPECT_EQ(out.num_slots, in.num_slots());
  EXPECT_EQ(out.disk_block_tokens, static_cast<int32_t>(in.disk_block_tokens()));
  EXPECT_EQ(out.max_step_rows, in.max_step_rows());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(ToProto(out.model), in.model()));
}

TEST(NodeConfigProtoTest, AcksCarryEveryField) {
  const control::MemoryConfigAck memory = ToProto(MemoryConfigAck{7, 8, {9, true, 10, 13}});
  EXPECT_TRUE(UnsetFields(memory).empty());
  EXPECT_EQ(memory.num_slots(), 7u);
  EXPECT_EQ(memory.kv_bytes(), 8u);
  EXPECT_EQ(memory.disk_extents(), 9u);
  EXPECT_TRUE(memory.disk_direct());
  EXPECT_EQ(memory.disk_block_bytes(), 10u);
  EXPECT_EQ(memory.disk_tier(), 13u);
  const control::ComputeConfigAck compute = ToProto(ComputeConfigAck{9, {11, true, 12, 14}});
  EXPECT_TRUE(UnsetFields(compute).empty());
  EXPECT_EQ(compute.local_kv_slots(), 9u);
  EXPECT_EQ(compute.disk_extents(), 11u);
  EXPECT_TRUE(compute.disk_direct());
  EXPECT_EQ(compute.disk_block_bytes(), 12u);
  EXPECT_EQ(compute.disk_tier(), 14u);
}

TEST(NodeConfigProtoTest, KvMovesRoundTripEveryFieldAndKind) {
  for (const auto kind : {KvMove::Kind::kSave, KvMove::Kind::kLoad, KvMove::Kind::kDrop}) {
    const KvMove in{kind, 12, 0xabcdef0123456789ull, {4, 5, 6}, 0x1234567890ull};
    const control::KvMove wire = ToProto(in);
    EXPECT_TRUE(UnsetFields(wire).empty());
    auto out = FromProto(wire);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->kind, in.kind);
    EXPECT_EQ(out->extent, in.extent);
    EXPECT_EQ(out->key, in.key);
    EXPECT_EQ(out->slots, in.slots);
    EXPECT_EQ(out->ticket, in.ticket);
  }
  control::KvMove unknown;
  unknown.set_kind(static_cast<control::KvMove::Kind>(9));
  EXPECT_TRUE(absl::IsInvalidArgument(FromProto(unknown).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(FromProto(control::KvMove()).status()));
  // A batch: every move in order, or the error of the first malformed one.
  control::KvMoves batch;
  *batch.add_moves() = ToProto(KvMove{KvMove::Kind::kLoad, 1, 2, {3}});
  *batch.add_moves() = ToProto(KvMove{KvMove::Kind::kDrop, 4, 0, {}});
  auto moves = MovesFromProto(batch);
  ASSERT_TRUE(moves.ok()) << moves.status();
  ASSERT_EQ(moves->size(), 2u);
  EXPECT_EQ((*moves)[0].kind, KvMove::Kind::kLoad);
  EXPECT_EQ((*moves)[1].extent, 4u);
  *batch.add_moves() = unknown;
  EXPECT_TRUE(absl::IsInvalidArgument(MovesFromProto(batch).status()));
}

TEST(NodeConfigProtoTest, ComputeConfigFromProtoKeepsEveryMemoryNode) {
  control::ComputeConfig in;
  FillScalars(&in, 300);
  for (int i = 0; i < 3; ++i) FillScalars(in.add_memory_nodes(), 400 + 10 * i);
  for (int i = 0; i < 2; ++i) FillScalars(in.add_departed_replicas(), 500 + 10 * i);
  EXPECT_TRUE(UnsetFields(in).empty());
  EXPECT_TRUE(UnsetFields(in.memory_nodes(0)).empty());
  EXPECT_TRUE(UnsetFields(in.departed_replicas(0)).empty());
  const ComputeConfig out = FromProto(in);
  EXPECT_EQ(out.epoch, in.epoch());
  EXPECT_EQ(out.disaggregated, in.disaggregated());
  EXPECT_EQ(out.disk_block_tokens, static_cast<int32_t>(in.disk_block_tokens()));
  ASSERT_EQ(out.memory_nodes.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out.memory_nodes[i].pool, PoolIndex(in.memory_nodes(i).pool_index()));
    EXPECT_EQ(out.memory_nodes[i].name, in.memory_nodes(i).name());
    EXPECT_EQ(out.memory_nodes[i].data_address, in.memory_nodes(i).data_address());
  }
  ASSERT_EQ(out.departed_replicas.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out.departed_replicas[i].context_address, in.departed_replicas(i).context_address());
    EXPECT_EQ(out.departed_replicas[i].through_step, in.departed_replicas(i).through_step());
  }
}

}  // namespace
}  // namespace strata
