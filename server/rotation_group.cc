#include "server/rotation_group.h"

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace strata {

RotationGroup::RotationGroup(int batches, int num_layers)
    : batches_(batches), num_layers_(num_layers), slot_busy_(batches, false) {}

RotationGroup::~RotationGroup() {
  // The replicas' executors fail the plans they still hold through this group's callbacks
  // as they go: let them go here, while the group is whole, not on a retire thread.
  SetRetire(nullptr);
  std::map<std::string, Replica> replicas;
  {
    std::lock_guard<std::mutex> lock(mu_);
    replicas.swap(replicas_);
  }
  replicas.clear();
}

std::shared_ptr<StepExecutor> RotationGroup::AddReplica(const std::string& name,
                                                        const std::string& context_address,
                                                        std::shared_ptr<StepExecutor> executor,
                                                        bool active) {
  std::shared_ptr<StepExecutor> replaced;  // the caller's, to destroy after its locks
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = replicas_.find(name); it != replicas_.end()) replaced = it->second.executor;
  replicas_[name] = {name, context_address, Retiring(std::move(executor)), false, active};
  // Back at an address that departed: its steps from now on are not given up (the replicas
  // count departures by step, and the list sent from now on no longer names it).
  ForgetDepartureLocked(context_address);
  LOG(INFO) << "rotation: replica " << name << " joins (contexts at " << context_address << "); "
            << replicas_.size() << " replica(s) for " << batches_ << " batches";
  return replaced;
}

void RotationGroup::ActivateReplica(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = replicas_.find(name);
  if (it == replicas_.end()) return;
  it->second.active = true;
  it->second.unreachable = false;
}

std::shared_ptr<StepExecutor> RotationGroup::RemoveReplica(const std::string& name) {
  // The executor goes to the caller, outside this lock: its destructor fails the plans it
  // still holds through this group's callbacks, which take the lock.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = replicas_.find(name);
  if (it == replicas_.end()) return nullptr;
  std::shared_ptr<StepExecutor> removed = std::move(it->second.executor);
  if (it->second.last_step != 0) {
    ForgetDepartureLocked(it->second.address);
    departures_.push_back({it->second.address, it->second.last_step});
    if (departures_.size() > kMaxDepartures) departures_.pop_front();
  }
  replicas_.erase(it);
  LOG(WARNING) << "rotation: replica " << name << " leaves; " << replicas_.size() << " left";
  return removed;
}

void RotationGroup::ForgetDepartureLocked(const std::string& address) {
  std::erase_if(departures_,
                [&](const DepartedReplica& d) { return d.context_address == address; });
}

std::vector<DepartedReplica> RotationGroup::Departures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {departures_.begin(), departures_.end()};
}

void RotationGroup::SetRetire(Retire retire) {
  {
    std::lock_guard<std::mutex> lock(retire_cell_->mu);
    std::swap(retire_cell_->retire, retire);
  }
  // The old function (and what it captured) goes outside the lock.
}

std::shared_ptr<StepExecutor> RotationGroup::Retiring(
    std::shared_ptr<StepExecutor> executor) const {
  if (executor == nullptr) return nullptr;
  StepExecutor* raw = executor.get();
  return std::shared_ptr<StepExecutor>(
      raw, [executor = std::move(executor), cell = retire_cell_](StepExecutor*) mutable {
        {
          std::lock_guard<std::mutex> lock(cell->mu);
          if (cell->retire) executor = cell->retire(std::move(executor));
        }
        executor.reset();  // not retired: destroyed here, outside the cell's lock
      });
}

void RotationGroup::SetRejoinHandler(std::function<void(const std::string&)> handler) {
  std::lock_guard<std::mutex> lock(mu_);
  rejoin_ = std::move(handler);
}

int RotationGroup::live_replicas() const {
  std::lock_guard<std::mutex> lock(mu_);
  int active = 0;
  for (const auto& [name, r] : replicas_) active += r.active ? 1 : 0;
  return active;
}

bool RotationGroup::Reachable() {
  std::vector<std::shared_ptr<StepExecutor>> executors;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, r] : replicas_) {
      if (r.active) executors.push_back(r.executor);
    }
  }
  int reachable = 0;
  for (const auto& e : executors) reachable += e->Reachable() ? 1 : 0;
  std::lock_guard<std::mutex> lock(mu_);
  int usable = 0;
  for (const auto& [name, r] : replicas_) usable += r.active && !r.unreachable ? 1 : 0;
  return reachable >= 2 || usable >= 2;
}

void RotationGroup::Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) {
  auto p = std::make_shared<Pending>();
  std::vector<Replica> members;
  // Replicas a step found unreachable rejoin once they can be reached (outside mu_: the
  // check asks the channel).
  std::vector<std::pair<std::string, std::shared_ptr<StepExecutor>>> suspects;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, r] : replicas_) {
      if (r.unreachable) suspects.emplace_back(name, r.executor);
    }
  }
  std::vector<std::string> back;
  for (const auto& [name, executor] : suspects) {
    if (executor->Reachable()) back.push_back(name);
  }
  std::function<void(const std::string&)> rejoin;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rejoin = rejoin_;
    for (const std::string& name : back) {
      auto it = replicas_.find(name);
      if (it == replicas_.end()) continue;
      // It missed plans while it was out, so it rejoins as a new replica does: inactive
      // until the scheduler has sent the set-ups again (without a handler, at once).
      it->second.unreachable = false;
      if (rejoin) it->second.active = false;
    }
    p->plan = std::move(plan);
    p->sink = std::move(sink);
    for (const auto& [name, r] : replicas_) {
      if (r.active && !r.unreachable) members.push_back(r);
    }
    for (int j = 0; j < batches_ && p->slot < 0; ++j) {
      if (!slot_busy_[j]) p->slot = j;
    }
    pending_.push_back(p);
    if (members.size() < 2 || p->slot < 0) {
      p->combined.step_id = p->plan->step_id;
      p->combined.node_unreachable = members.size() < 2;
      p->combined.status =
          members.size() < 2
              ? absl::UnavailableError(absl::StrCat("rotational pipelining needs 2 live compute "
                                                    "replicas; ",
                                                    members.size(), " are"))
              : absl::ResourceExhaustedError(
                    absl::StrCat("all ", batches_, " batch slots of the rotation are in flight"));
      p->done = true;
    } else {
      slot_busy_[p->slot] = true;
      p->sampler = static_cast<size_t>((p->slot + num_layers_) % static_cast<int>(members.size()));
      p->results.resize(members.size());
      for (const Replica& r : members) replicas_.at(r.name).last_step = p->plan->step_id;
    }
  }
  if (rejoin) {
    for (const std::string& name : back) rejoin(name);
  }
  if (p->done) return Deliver();
  std::vector<std::string> addresses;
  for (const Replica& r : members) addresses.push_back(r.address);
  for (size_t i = 0; i < members.size(); ++i) {
    // Each replica's plan differs in its rotation role.
    auto copy = std::make_shared<StepPlan>(*p->plan);
    copy->rotation.batch = p->slot;
    copy->rotation.replica = static_cast<int32_t>(i);
    copy->rotation.replicas = addresses;
    const std::string name = members[i].name;
    const StepExecutor* executor = members[i].executor.get();
    members[i].executor->Submit(std::move(copy), [this, p, i, name, executor](StepResult result) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (result.node_unreachable) {
          auto it = replicas_.find(name);
          if (it != replicas_.end() && it->second.executor.get() == executor) {
            it->second.unreachable = true;
          }
        }
        p->results[i] = std::move(result);
        if (++p->answered < p->results.size()) return;
        CombineLocked(*p);
        slot_busy_[p->slot] = false;
        p->done = true;
      }
      Deliver();
    });
  }
}

void RotationGroup::CombineLocked(Pending& p) {
  StepResult out = std::move(*p.results[p.sampler]);
  out.step_id = p.plan->step_id;
  std::unordered_set<SequenceId> failed;
  for (const auto& [id, why] : out.failed) failed.insert(id);
  for (size_t i = 0; i < p.results.size(); ++i) {
    if (i == p.sampler) continue;
    StepResult& r = *p.results[i];
    if (!r.status.ok() && (out.status.ok() || absl::IsCancelled(out.status))) {
      out.status = r.status;
      out.node_unreachable = out.node_unreachable || r.node_unreachable;
    }
    for (auto& [id, why] : r.failed) {
      if (failed.insert(id).second) out.failed.emplace_back(id, std::move(why));
    }
    for (PoolIndex pool : r.dead_pools) {
      if (std::find(out.dead_pools.begin(), out.dead_pools.end(), pool) == out.dead_pools.end()) {
        out.dead_pools.push_back(pool);
      }
    }
    out.timing.gemm_us += r.timing.gemm_us;
    out.timing.bytes_sent += r.timing.bytes_sent;
    out.timing.bytes_received += r.timing.bytes_received;
  }
  // A sequence whose rows lost their attention on any replica has no valid token.
  std::erase_if(out.tokens, [&](const SampledToken& t) { return failed.count(t.request_id) > 0; });
  if (!out.status.ok()) out.tokens.clear();
  p.combined = std::move(out);
}

void RotationGroup::Deliver() {
  std::vector<std::shared_ptr<Pending>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (delivering_) return;  // the thread delivering now hands these on too
    delivering_ = true;
  }
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready.clear();
      while (!pending_.empty() && pending_.front()->done) {
        ready.push_back(pending_.front());
        pending_.pop_front();
      }
      if (ready.empty()) {
        delivering_ = false;
        return;
      }
    }
    for (auto& p : ready) p->sink(std::move(p->combined));
  }
}

namespace {

class Forward : public StepExecutor {
 public:
  explicit Forward(std::shared_ptr<StepExecutor> to) : to_(std::move(to)) {}
  std::string name() const override { return to_->name(); }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override {
    to_->Submit(std::move(plan), std::move(sink));
  }
  bool Reachable() override { return to_->Reachable(); }

 private:
  std::shared_ptr<StepExecutor> to_;
};

}  // namespace

std::unique_ptr<StepExecutor> ForwardTo(std::shared_ptr<StepExecutor> executor) {
  return std::make_unique<Forward>(std::move(executor));
}

}  // namespace strata
