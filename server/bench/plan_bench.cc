// Planning benchmark (prints figures; no assertion): the scheduler's own time per step,
// building the plan and applying its result, with R running sequences and W requests
// waiting. The compute node is an executor that answers every sample at once with a fixed
// token, so the figures are the scheduler's alone; a step's cost should grow with R, the
// batch, and stay flat in W, the queue. step_us is the wall time per step of the whole loop
// (plan, hand-off, apply, stats), with the echo executor in place of a forward pass.
//
//   bazel build -c opt //server/bench:plan_bench
//   bazel-bin/server/bench/plan_bench [--running=1,64,256] [--waiting=0,10000] [--steps=300]
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/scheduler.h"
#include "server/step_executor.h"

ABSL_FLAG(std::string, running, "1,64,256", "Running sequences (the batch)");
ABSL_FLAG(std::string, waiting, "0,10000", "Requests waiting behind them");
ABSL_FLAG(int, steps, 300, "Decode steps measured per configuration");
ABSL_FLAG(int, prompt_tokens, 16, "Prompt length");

namespace strata {
namespace {

constexpr int32_t kVocab = 32000;
constexpr int32_t kToken = 7;  // what every sample draws (no EOS configured)

// Answers every sample of a plan with kToken, on the calling thread: no compute at all.
class EchoExecutor final : public StepExecutor {
 public:
  std::string name() const override { return "echo"; }
  void Submit(std::shared_ptr<const StepPlan> plan, StepResultSink sink) override {
    StepResult result;
    result.step_id = plan->step_id;
    for (const SequenceChunk& chunk : plan->chunks) {
      for (const SampleTarget& s : chunk.samples) result.tokens.push_back({s.request_id, kToken});
    }
    sink(std::move(result));
  }
};

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

struct Figures {
  double plan_us = 0, apply_us = 0, step_us = 0;
};

Figures Measure(int64_t running, int64_t waiting, int steps, int prompt_tokens) {
  SchedulerConfig config;
  config.max_num_seqs = running;
  config.max_num_batched_tokens = std::max<int64_t>(running, prompt_tokens) * 2;
  config.max_prefill_tokens = config.max_num_batched_tokens;
  config.max_model_len = 1 << 16;
  config.max_waiting = running + waiting + 1;
  config.vocab_size = kVocab;
  Scheduler scheduler(config, nullptr);
  const PoolIndex pool = scheduler.AddPool("local", int64_t{1} << 26);
  scheduler.AddExecutor(std::make_unique<EchoExecutor>(), pool);
  for (int64_t i = 0; i < running + waiting; ++i) {
    GenerateRequest r;
    for (int t = 0; t < prompt_tokens; ++t) {
      r.prompt_tokens.push_back(static_cast<int32_t>((i * 131 + t * 17) % kVocab));
    }
    r.has_seed = true;
    r.max_tokens = config.max_model_len - prompt_tokens;  // nobody finishes while measured
    if (!scheduler.Submit(std::move(r), [](const RequestUpdate&) {}).ok()) {
      std::fprintf(stderr, "submit failed\n");
      std::exit(1);
    }
  }
  scheduler.Start();
  // Steady state: the batch is full and decoding.
  SchedulerStats before;
  for (;;) {
    before = scheduler.Stats();
    if (before.num_running == running && before.steps_total >= 20) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  const absl::Time start = absl::Now();
  SchedulerStats after;
  for (;;) {
    after = scheduler.Stats();
    if (after.steps_total >= before.steps_total + steps) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  const absl::Duration wall = absl::Now() - start;
  scheduler.Stop();
  Figures f;
  f.step_us = absl::ToDoubleMicroseconds(wall) /
              std::max<int64_t>(1, after.steps_total - before.steps_total);
  f.plan_us = 1e6 * (after.plan_seconds_total - before.plan_seconds_total) /
              std::max<int64_t>(1, after.plans_total - before.plans_total);
  f.apply_us = 1e6 * (after.apply_seconds_total - before.apply_seconds_total) /
               std::max<int64_t>(1, after.steps_total - before.steps_total);
  if (after.num_waiting != waiting) {
    std::fprintf(stderr, "note: %lld waiting at the end, expected %lld\n",
                 static_cast<long long>(after.num_waiting), static_cast<long long>(waiting));
  }
  return f;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const auto running = strata::ParseList(absl::GetFlag(FLAGS_running));
  const auto waiting = strata::ParseList(absl::GetFlag(FLAGS_waiting));
  std::printf("scheduler time per decode step (echo executor, %d steps each)\n",
              absl::GetFlag(FLAGS_steps));
  std::printf("%-8s %8s %10s %10s %10s %10s\n", "running", "waiting", "plan_us", "apply_us",
              "total_us", "step_us");
  for (int64_t r : running) {
    for (int64_t w : waiting) {
      const auto f =
          strata::Measure(r, w, absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_prompt_tokens));
      std::printf("%-8lld %8lld %10.1f %10.1f %10.1f %10.1f\n", static_cast<long long>(r),
                  static_cast<long long>(w), f.plan_us, f.apply_us, f.plan_us + f.apply_us,
                  f.step_us);
      std::fflush(stdout);
    }
  }
  return 0;
}
