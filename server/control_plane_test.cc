// The control plane's retire function for executors that leave the rotation (ControlPlane's
// constructor hands it to RotationGroup::SetRetire): wherever the last copy of a replica's
// executor goes, the executor is destroyed on the plane's release thread ("ctl-release"),
// not on the thread that let it go, which may be the scheduler's; and once the plane has
// stopped, the function is cleared and the executor is destroyed where its last copy goes.
// (The function's refused post, for a release loop that stopped while the function was
// still set, cannot happen through Stop, which clears the function first.)
#include "server/control_plane.h"

#include <pthread.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "common/control/cluster_auth.h"
#include "gtest/gtest.h"
#include "server/rotation_group.h"
#include "server/scheduler.h"

namespace strata {
namespace {

std::string ThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// Tells the name of the thread that destroys it.
class Recorded : public StepExecutor {
 public:
  explicit Recorded(std::promise<std::string>* destroyed_on) : destroyed_on_(destroyed_on) {}
  ~Recorded() override { destroyed_on_->set_value(ThreadName()); }
  std::string name() const override { return "recorded"; }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override {
    StepResult r;
    r.step_id = plan->step_id;
    r.status = absl::UnavailableError("not a compute node");
    sink(std::move(r));
  }
  bool Reachable() override { return true; }

 private:
  std::promise<std::string>* destroyed_on_;
};

// Where the executor that left under `name` is destroyed once the test lets its copy go.
std::string DestroyedOn(RotationGroup& group, const std::string& name) {
  std::promise<std::string> destroyed_on;
  std::future<std::string> where = destroyed_on.get_future();
  EXPECT_EQ(group.AddReplica(name, "address-of-" + name, std::make_shared<Recorded>(&destroyed_on)),
            nullptr);
  std::shared_ptr<StepExecutor> left = group.RemoveReplica(name);
  EXPECT_NE(left, nullptr);
  left.reset();  // the last copy
  if (where.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << name << " was not destroyed within 10 s";
    std::abort();  // the promise on this frame would be written later
  }
  return where.get();
}

TEST(ControlPlaneRetireTest, AnExecutorThatLeftIsDestroyedOnTheReleaseThreadUntilThePlaneStops) {
  Scheduler scheduler(SchedulerConfig{}, nullptr);
  auto group = std::make_shared<RotationGroup>(/*batches=*/2, /*num_layers=*/4);
  ControlPlaneOptions options;
  options.auth = ClusterAuth::Insecure();
  options.rotation = group;
  ControlPlane plane(&scheduler, std::move(options));
  const std::string here = ThreadName();
  ASSERT_NE(here, "ctl-release");

  EXPECT_EQ(DestroyedOn(*group, "replica-a"), "ctl-release");
  EXPECT_EQ(DestroyedOn(*group, "replica-b"), "ctl-release");

  plane.Stop();
  EXPECT_EQ(DestroyedOn(*group, "replica-c"), here);
}

}  // namespace
}  // namespace strata
