#include "server/batch_planner.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace strata {
namespace {

class Planner {
 public:
  explicit Planner(const PlannerInput& in)
      : in_(in), requests_(in.requests), seqs_(in.seqs), pools_(in.pools), budgets_(in.budgets) {
    out_.planned.assign(requests_.size(), false);
    out_.preempted.assign(requests_.size(), false);
    for (size_t r = 0; r < requests_.size(); ++r) {
      if (requests_[r].eligible) running_.push_back(static_cast<int>(r));
    }
  }

  PlannerOutput Run() && {
    Decode();
    Prefill();
    out_.budgets = budgets_;
    return std::move(out_);
  }

 private:
  enum class Room { kMade, kWait, kNone };

  bool Live(int r) const { return !out_.preempted[r]; }

  void Preempt(int r) {
    out_.preempted[r] = true;
    PlannerAction& a = out_.actions.emplace_back();
    a.kind = PlannerAction::Kind::kPreempt;
    a.request = r;
    // One in flight keeps its slots until its plan lands.
    if (requests_[r].in_flight) return;
    const PreemptionFrees f = in_.freed(r);
    a.frees = f.available;
    PlannerPool& pool = pools_[requests_[r].pool];
    pool.available += f.available;
    pool.saving += f.saving;
  }

  // Makes `need` slots available in request r's pool by preempting running requests that
  // rank below it, are not in flight and are not in this plan, the lowest first. kWait:
  // saves to disk in flight free enough once they are back (an event that plans again), so
  // nothing is preempted and r waits. kNone: nobody below r can give slots up.
  Room MakeRoom(int r, int64_t need) {
    const PlannerRequest& req = requests_[r];
    PlannerPool& pool = pools_[req.pool];
    while (pool.available < need) {
      if (pool.available + pool.saving >= need) return Room::kWait;
      int victim = -1;
      for (int o = static_cast<int>(requests_.size()) - 1; o > r; --o) {
        const PlannerRequest& other = requests_[o];
        if (!Live(o) || other.in_flight || out_.planned[o] || other.pool != req.pool) continue;
        victim = o;
        break;
      }
      if (victim < 0) return Room::kNone;
      Preempt(victim);
    }
    return Room::kMade;
  }

  void Chunk(int r, int s, int64_t begin, int64_t end, int64_t allocate, bool ahead) {
    PlannerSequence& seq = Seq(r, s);
    allocate = std::max<int64_t>(0, allocate);
    seq.table += allocate;
    pools_[requests_[r].pool].available -= allocate;
    out_.planned[r] = true;
    PlannerAction a;
    a.kind = PlannerAction::Kind::kChunk;
    a.request = r;
    a.seq = s;
    a.begin = begin;
    a.end = end;
    a.allocate = allocate;
    a.ahead = ahead;
    out_.actions.push_back(a);
  }

  void Decode() {
    // The decode work this plan may take: a share of all of it, counting the plans in
    // flight; a plan is full once its shares of rows and of KV positions add up.
    double total_rows = in_.in_flight_rows, total_kv = in_.in_flight_kv;
    double plan_rows = 0, plan_kv = 0;
    if (in_.balance) {
      for (int r : running_) {
        for (int s = 0; s < requests_[r].num_seqs; ++s) {
          const PlannerSequence& seq = Seq(r, s);
          if (!seq.DecodeReady()) continue;
          total_rows += 1;
          total_kv += static_cast<double>(seq.tokens);
        }
      }
    }
    auto full = [&] {
      return in_.balance && plan_rows > 0 && total_rows > 0 && total_kv > 0 &&
             plan_rows / total_rows + plan_kv / total_kv >= in_.plan_share;
    };
    for (int r : running_) {
      if (full()) break;
      if (!Live(r)) continue;
      const PlannerRequest& req = requests_[r];
      std::vector<int> decode, ahead;
      for (int s = 0; s < req.num_seqs; ++s) {
        const PlannerSequence& seq = Seq(r, s);
        if (seq.finished || seq.waiting_for_owner) continue;
        if (seq.DecodeReady()) {
          decode.push_back(s);
        } else if (in_.async && seq.in_flight == 1 && seq.in_flight_samples &&
                   seq.num_outputs + 1 < req.max_tokens) {
          ahead.push_back(s);
        }
      }
      if (decode.empty() && ahead.empty()) continue;
      if (static_cast<int64_t>(decode.size() + ahead.size()) >
          std::min(budgets_.rows, budgets_.seqs)) {
        break;
      }
      int64_t need = 0;
      for (int s : decode) need += Seq(r, s).tokens - Seq(r, s).table;
      if (const Room room = need > 0 ? MakeRoom(r, need) : Room::kMade; room != Room::kMade) {
        if (room == Room::kNone) Preempt(r);  // nothing below it to take from: it yields
        continue;
      }
      for (int s : decode) {
        const PlannerSequence& seq = Seq(r, s);
        Chunk(r, s, seq.computed, seq.computed + 1, seq.tokens - seq.table, false);
        budgets_.TakeDecodeRow();
        plan_rows += 1;
        plan_kv += static_cast<double>(seq.tokens);
      }
      // A row ahead never preempts its own request: without room it waits for the token.
      int64_t need_ahead = 0;
      for (int s : ahead) need_ahead += Seq(r, s).tokens + 1 - Seq(r, s).table;
      if (need_ahead > 0 && MakeRoom(r, need_ahead) != Room::kMade) continue;
      for (int s : ahead) {
        const PlannerSequence& seq = Seq(r, s);
        Chunk(r, s, seq.tokens, seq.tokens + 1, seq.tokens + 1 - seq.table, true);
        budgets_.TakeDecodeRow();
      }
    }
  }

  void Prefill() {
    for (int r : running_) {
      if (budgets_.rows <= 0 || budgets_.prefill <= 0) break;
      if (!Live(r)) continue;
      const PlannerRequest& req = requests_[r];
      for (int s = 0; s < req.num_seqs; ++s) {
        PlannerSequence& seq = Seq(r, s);
        if (seq.finished || seq.in_flight > 0 || budgets_.Exhausted()) continue;
        if (seq.waiting_for_owner) {
          // Samples with outputs of their own (after preemption) prefill them once the
          // owner has the prompt; samples without wait for the owner's first draw.
          if (seq.tokens <= req.prompt_len || req.owner < 0 ||
              Seq(r, req.owner).computed < req.prompt_len || out_.planned[r]) {
            continue;
          }
          seq.table = seq.computed = req.prompt_len;
          seq.waiting_for_owner = false;
          PlannerAction a;
          a.kind = PlannerAction::Kind::kShare;
          a.request = r;
          a.seq = s;
          out_.actions.push_back(a);
        }
        if (seq.computed >= seq.tokens - 1) continue;  // decode-ready (or done) already
        const int64_t count = budgets_.PromptRows(seq.tokens - seq.computed, in_.chunk_limit);
        if (!in_.chunked && count < seq.tokens - seq.computed) continue;
        const int64_t end = seq.computed + count;
        const int64_t need = end - seq.table;
        if (need > 0 && MakeRoom(r, need) != Room::kMade) continue;
        Chunk(r, s, seq.computed, end, need, false);
        budgets_.TakePrompt(count);
      }
    }
  }

  PlannerSequence& Seq(int r, int s) { return seqs_[requests_[r].first_seq + s]; }

  const PlannerInput& in_;
  const std::vector<PlannerRequest>& requests_;
  std::vector<PlannerSequence> seqs_;  // changed as the plan takes slots and shares prompts
  std::vector<PlannerPool> pools_;
  std::vector<int> running_;  // the eligible requests, in rank order
  StepBudgets budgets_;
  PlannerOutput out_;
};

}  // namespace

PlannerOutput PlanRunning(const PlannerInput& in) { return Planner(in).Run(); }

Admission::Admission(const StepBudgets& budgets, const AdmissionLimits& limits)
    : limits_(limits), budgets_(budgets) {}

Admission::Verdict Admission::Consider(int64_t length, bool has_owner, bool finishing) const {
  if (budgets_.Exhausted() || limits_.admit_cap <= 0) return Verdict::kStop;
  if (finishing || !has_owner) return Verdict::kSkip;
  if (limits_.largest_pool == 0) return Verdict::kStop;
  if (length > limits_.largest_pool) return Verdict::kFail;
  // Unchunked, a prompt runs whole or waits, and so does everyone behind it.
  if (!limits_.chunked && length > budgets_.rows) return Verdict::kStop;
  return Verdict::kPlace;
}

int64_t Admission::Admit(int64_t computed, int64_t length) {
  --limits_.admit_cap;
  const int64_t rows = budgets_.PromptRows(length - computed, limits_.chunk_limit);
  budgets_.TakePrompt(rows);
  return rows;
}

void Admission::AdmitLoading(bool over_loads) {
  --limits_.admit_cap;
  if (!over_loads) --budgets_.seqs;
}

int64_t Admission::PreloadRows(int64_t remaining, int64_t room) const {
  if (budgets_.Exhausted()) return 0;
  const int64_t rows = budgets_.PromptRows(remaining, limits_.chunk_limit);
  if (rows <= 0 || rows > room) return 0;
  if (!limits_.chunked && rows < remaining) return 0;
  return rows;
}

void Admission::Take(int64_t rows) { budgets_.TakePrompt(rows); }

std::vector<int> RankPlacements(const std::vector<PlacementCandidate>& candidates,
                                int block_tokens) {
  auto prefix = [&](const PlacementCandidate& c) {
    return static_cast<int64_t>(c.dram_blocks + c.disk_blocks + c.move_blocks);
  };
  int64_t longest = 0;
  for (const PlacementCandidate& c : candidates) longest = std::max(longest, prefix(c));
  auto rank = [&](int i) {
    const PlacementCandidate& c = candidates[i];
    const bool near = (longest - prefix(c)) * block_tokens < kPrefixOutweighsLoadTokens;
    return std::make_tuple(near, near ? -c.used : 0, prefix(c), c.dram_blocks + c.move_blocks,
                           c.available);
  };
  std::vector<int> order(candidates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return rank(a) > rank(b); });
  return order;
}

ReserveVerdict PrefetchReserve(int64_t available, int64_t fresh, int64_t reserve, bool alone,
                               bool has_prefix) {
  if (reserve < 0 || alone || available - fresh >= reserve) return ReserveVerdict::kPlace;
  return has_prefix ? ReserveVerdict::kWait : ReserveVerdict::kNextPool;
}

}  // namespace strata
