#include "common/protocol/node_config_proto.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata {

control::ModelShape ToProto(const ModelShape& shape) {
  control::ModelShape out;
  out.set_name(shape.name);
  out.set_num_layers(shape.num_layers);
  out.set_num_heads(shape.num_heads);
  out.set_num_kv_heads(shape.num_kv_heads);
  out.set_head_dim(shape.head_dim);
  out.set_kv_dtype(shape.kv_dtype);
  out.set_vocab_size(shape.vocab_size);
  out.set_max_position_embeddings(shape.max_position_embeddings);
  return out;
}

ModelShape FromProto(const control::ModelShape& in) {
  return {in.name(),     in.num_layers(), in.num_heads(),  in.num_kv_heads(),
          in.head_dim(), in.kv_dtype(),   in.vocab_size(), in.max_position_embeddings()};
}

control::NodeStatus ToProto(const NodeStatus& status) {
  control::NodeStatus out;
  out.set_ready(status.ready);
  out.set_kv_slots_total(status.kv_slots_total);
  out.set_kv_slots_in_tables(status.kv_slots_in_tables);
  out.set_steps_executed(status.steps_executed);
  out.set_error(status.error);
  out.set_attention_us(status.attention_us);
  out.set_layer_frames(status.layer_frames);
  out.set_bytes_received(status.bytes_received);
  out.set_bytes_sent(status.bytes_sent);
  out.set_checksum_failures(status.checksum_failures);
  out.set_malformed_frames(status.malformed_frames);
  return out;
}

MemoryConfig FromProto(const control::MemoryConfig& in) {
  return {in.epoch(),
          PoolIndex(in.pool_index()),
          FromProto(in.model()),
          in.num_slots(),
          static_cast<int32_t>(in.disk_block_tokens()),
          in.max_step_rows()};
}

control::KvMove ToProto(const KvMove& move) {
  control::KvMove out;
  out.set_kind(move.kind == KvMove::Kind::kSave   ? control::KvMove::SAVE
               : move.kind == KvMove::Kind::kLoad ? control::KvMove::LOAD
                                                  : control::KvMove::DROP);
  out.set_extent(move.extent);
  out.set_key(move.key);
  out.mutable_slots()->Assign(move.slots.begin(), move.slots.end());
  out.set_ticket(move.ticket);
  return out;
}

absl::StatusOr<KvMove> FromProto(const control::KvMove& in) {
  KvMove out;
  switch (in.kind()) {
    case control::KvMove::SAVE:
      out.kind = KvMove::Kind::kSave;
      break;
    case control::KvMove::LOAD:
      out.kind = KvMove::Kind::kLoad;
      break;
    case control::KvMove::DROP:
      out.kind = KvMove::Kind::kDrop;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown KV move kind ", in.kind()));
  }
  out.extent = in.extent();
  out.key = in.key();
  out.slots.assign(in.slots().begin(), in.slots().end());
  out.ticket = in.ticket();
  return out;
}

absl::StatusOr<std::vector<KvMove>> MovesFromProto(const control::KvMoves& in) {
  std::vector<KvMove> out;
  out.reserve(in.moves_size());
  for (const control::KvMove& m : in.moves()) {
    auto move = FromProto(m);
    if (!move.ok()) return move.status();
    out.push_back(*std::move(move));
  }
  return out;
}

control::MemoryConfigAck ToProto(const MemoryConfigAck& ack) {
  control::MemoryConfigAck out;
  out.set_num_slots(ack.num_slots);
  out.set_kv_bytes(ack.kv_bytes);
  out.set_disk_extents(ack.disk.extents);
  out.set_disk_direct(ack.disk.direct);
  out.set_disk_block_bytes(ack.disk.block_bytes);
  out.set_disk_tier(ack.disk.tier);
  return out;
}

ComputeConfig FromProto(const control::ComputeConfig& in) {
  ComputeConfig out;
  out.epoch = in.epoch();
  out.disaggregated = in.disaggregated();
  out.disk_block_tokens = static_cast<int32_t>(in.disk_block_tokens());
  for (const control::MemoryNodeAddress& m : in.memory_nodes()) {
    out.memory_nodes.push_back({PoolIndex(m.pool_index()), m.name(), m.data_address()});
  }
  for (const control::DepartedReplica& d : in.departed_replicas()) {
    out.departed_replicas.push_back({d.context_address(), d.through_step()});
  }
  return out;
}

control::ComputeConfigAck ToProto(const ComputeConfigAck& ack) {
  control::ComputeConfigAck out;
  out.set_local_kv_slots(ack.local_kv_slots);
  out.set_disk_extents(ack.disk.extents);
  out.set_disk_direct(ack.disk.direct);
  out.set_disk_block_bytes(ack.disk.block_bytes);
  out.set_disk_tier(ack.disk.tier);
  return out;
}

}  // namespace strata
