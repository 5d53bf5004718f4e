#include "common/protocol/attention_wire.h"

#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/protocol/kv_shift_proto.h"
#include "proto/data_plane.pb.h"

namespace strata {

std::string EncodeStepShare(const StepShare& share) {
  data::StepDescriptor d;
  d.set_step_id(share.step_id);
  d.set_epoch(share.epoch);
  d.set_pool(share.pool.value());
  d.set_num_layers(share.num_layers);
  for (const TableRelease& r : share.plan.releases) d.add_released(r.request_id.value());
  for (const SlotAssignment& a : share.plan.assignments) {
    data::SlotExtent* e = d.add_assignments();
    e->set_request_id(a.request_id.value());
    e->set_start(a.start);
    e->mutable_slots()->Add(a.slots.begin(), a.slots.end());
    KvShiftsToProto(a.shifts, e->mutable_shifts());
  }
  for (const AttentionRowPlan& r : share.plan.rows) {
    d.add_row_request(r.request_id.value());
    d.add_row_position(r.position);
    d.add_row_tile_limit(r.tile_limit);
  }
  for (uint32_t n : share.minibatch_rows) d.add_minibatch_rows(n);
  for (const PendingLoad& l : share.plan.loads) {
    d.add_load_request(l.request_id.value());
    d.add_load_ticket(l.ticket);
  }
  return d.SerializeAsString();
}

absl::StatusOr<StepShare> DecodeStepShare(std::span<const uint8_t> bytes) {
  data::StepDescriptor d;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("step descriptor of ", bytes.size(), " bytes (protobuf reads at most 2 GiB)"));
  }
  if (!d.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("step descriptor does not parse");
  }
  const int rows = d.row_request_size();
  if (d.row_position_size() != rows || d.row_tile_limit_size() != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", d.step_id(), " descriptor has ", rows, " row requests, ", d.row_position_size(),
        " positions and ", d.row_tile_limit_size(), " tile limits"));
  }
  int64_t total = 0;
  for (uint32_t n : d.minibatch_rows()) {
    if (n == 0) return absl::InvalidArgumentError("step descriptor has an empty mini-batch");
    total += n;
  }
  if (total != rows) {
    return absl::InvalidArgumentError(absl::StrCat("step ", d.step_id(), " mini-batches hold ",
                                                   total, " rows; the step has ", rows));
  }
  if (d.load_request_size() != d.load_ticket_size()) {
    return absl::InvalidArgumentError(absl::StrCat("step ", d.step_id(), " descriptor has ",
                                                   d.load_request_size(), " loading requests and ",
                                                   d.load_ticket_size(), " tickets"));
  }
  // One load per loading request with rows in the step: no more loads than rows, and no
  // ticket twice (each is awaited, so made-up ones must stay few).
  if (d.load_request_size() > rows) {
    return absl::InvalidArgumentError(absl::StrCat("step ", d.step_id(), " descriptor has ",
                                                   d.load_request_size(), " loading requests for ",
                                                   rows, " rows"));
  }
  absl::flat_hash_set<uint64_t> tickets;
  for (uint64_t ticket : d.load_ticket()) {
    if (ticket != 0 && !tickets.insert(ticket).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", d.step_id(), " descriptor names load ticket ", ticket, " twice"));
    }
  }
  StepShare share;
  share.step_id = d.step_id();
  share.epoch = d.epoch();
  share.pool = PoolIndex(d.pool());
  share.num_layers = d.num_layers();
  for (uint64_t id : d.released()) share.plan.releases.push_back({SequenceId(id), share.pool});
  for (const data::SlotExtent& e : d.assignments()) {
    SlotAssignment a{SequenceId(e.request_id()),
                     share.pool,
                     e.start(),
                     {e.slots().begin(), e.slots().end()},
                     {}};
    if (absl::Status s = KvShiftsFromProto(e.shifts(), &a.shifts); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("step ", d.step_id(), ": ", s.message()));
    }
    share.plan.assignments.push_back(std::move(a));
  }
  for (int i = 0; i < rows; ++i) {
    share.plan.rows.push_back(
        {SequenceId(d.row_request(i)), share.pool, d.row_position(i), d.row_tile_limit(i)});
  }
  share.plan.step_id = share.step_id;
  share.minibatch_rows.assign(d.minibatch_rows().begin(), d.minibatch_rows().end());
  for (int i = 0; i < d.load_request_size(); ++i) {
    share.plan.loads.push_back({SequenceId(d.load_request(i)), share.pool, d.load_ticket(i)});
  }
  return share;
}

std::vector<MinibatchLayout> LayoutMinibatches(const StepShare& share, const AttentionDims& dims) {
  std::vector<MinibatchLayout> out;
  int begin = 0;
  for (uint32_t n : share.minibatch_rows) {
    MinibatchLayout m;
    m.begin = begin;
    m.end = begin + static_cast<int>(n);
    for (int i = m.begin; i < m.end; ++i) {
      const int32_t limit = share.plan.rows[i].tile_limit;
      if (limit < 0) {
        ++m.finals;
      } else if (limit == 0) {
        ++m.writes;
      } else {
        ++m.partials;
      }
    }
    m.q_bytes = (m.finals + m.partials) * dims.q_row_bytes();
    m.kv_bytes = n * dims.kv_row_bytes();
    m.out_bytes = m.finals * dims.q_row_bytes();
    m.state_bytes = m.partials * dims.state_row_bytes();
    out.push_back(m);
    begin = m.end;
  }
  return out;
}

std::vector<uint32_t> SplitMinibatches(int rows, int count) {
  std::vector<uint32_t> out;
  if (rows <= 0) return out;
  count = std::max(1, std::min(count, rows));
  for (int i = 0; i < count; ++i) {
    out.push_back(static_cast<uint32_t>(rows * (i + 1) / count - rows * i / count));
  }
  return out;
}

}  // namespace strata
