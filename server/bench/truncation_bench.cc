// Context truncation benchmark (prints figures; no assertion). A conversation outgrows the
// context; its next turn is truncated (server/truncation.h) and its kept tail's KV moves
// from the earlier turn (K re-rotated). For each conversation, interleaved:
//   moved    the truncated turn on the deployment that served the earlier turn;
//   fresh    the same truncated prompt on a deployment that has seen nothing (a full
//            prefill: the reference the moved KV is compared with);
//   full     the untruncated prompt on a deployment with twice the context (what the
//            model would say had nothing been dropped).
// It prints, per conversation and as medians: TTFT of moved and fresh; for the first output
// token, the mean |logprob difference| over the reference's top-20 tokens and whether the
// top token agrees; and how many of the greedy tokens agree before the first difference.
// The model has random weights (the generated demo shape), so the figures say how far the
// moved KV is from a fresh prefill on this model, not how a trained model's answers change.
//
//   bazel build -c opt //server/bench:truncation_bench
//   bazel-bin/server/bench/truncation_bench --model=$STRATA_CACHE_DIR/models/demo
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "server/in_process_deployment.h"

ABSL_FLAG(std::string, model, "", "Model directory (the generated demo model)");
ABSL_FLAG(int, context, 1024, "Context length (max_model_len) of the truncating deployment");
ABSL_FLAG(int, conversations, 6, "Conversations (each one truncated turn)");
ABSL_FLAG(int, answer_tokens, 32, "Tokens of the earlier turn's answer and of the next one");
ABSL_FLAG(int, question_tokens, 128, "Tokens of the next turn's new question");
ABSL_FLAG(int, memory_nodes, 0, "0: co-located; 1: one memory node (in-process transport)");

namespace strata {
namespace {

using in_process::Deployment;
using in_process::Outcome;
using in_process::Topology;

using in_process::RandomPrompt;

GenerateRequest Turn(std::vector<int32_t> prompt, int max_tokens) {
  return in_process::GreedyTurn(std::move(prompt), max_tokens, 20);
}

struct Run {
  std::shared_ptr<Outcome> outcome;
  double ttft_s = 0.0;
};

// One request alone on `d`: its output and time to first token.
Run Serve(Deployment& d, GenerateRequest r) {
  Run run;
  const absl::Time start = absl::Now();
  run.outcome = d.Submit(std::move(r));
  d.Wait({run.outcome});
  run.ttft_s = absl::ToDoubleSeconds(run.outcome->first_token - start);
  return run;
}

// Mean |logprob difference| over the reference's top tokens present in both, at the first
// output token (NaN: none in common).
double FirstTokenDistance(const Outcome& got, const Outcome& ref) {
  if (got.top_logprobs.empty() || ref.top_logprobs.empty()) return NAN;
  std::map<int32_t, float> mine(got.top_logprobs[0].begin(), got.top_logprobs[0].end());
  double sum = 0.0;
  int n = 0;
  for (const auto& [token, logprob] : ref.top_logprobs[0]) {
    auto it = mine.find(token);
    if (it == mine.end()) continue;
    sum += std::abs(it->second - logprob);
    ++n;
  }
  return n > 0 ? sum / n : NAN;
}

int AgreeingPrefix(const Outcome& a, const Outcome& b) {
  size_t n = 0;
  while (n < a.tokens.size() && n < b.tokens.size() && a.tokens[n] == b.tokens[n]) ++n;
  return static_cast<int>(n);
}

// Of the values that are not NaN (a distance with no top token in common).
double Median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  auto config = LoadModelConfig(dir);
  if (!config.ok()) {
    std::fprintf(stderr, "--model: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  auto weights = ModelWeights::Load(dir, *config);
  if (!weights.ok()) {
    std::fprintf(stderr, "--model: %s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  const int context = absl::GetFlag(FLAGS_context);
  const int answer = absl::GetFlag(FLAGS_answer_tokens);
  const int question = absl::GetFlag(FLAGS_question_tokens);
  Topology truncating{absl::GetFlag(FLAGS_memory_nodes), 1};
  truncating.max_model_len = context;
  truncating.context_overflow = ContextOverflow::kTruncate;
  Topology wide = truncating;
  wide.max_model_len = 2 * context;
  wide.context_overflow = ContextOverflow::kError;
  const int64_t slots = 4 * context;
  // The earlier turn fills the context but for its answer; the next one overflows by about
  // the new question.
  const int history = context - answer - 8;
  std::printf("model %s, context %d, earlier turn %d + %d tokens, new question %d, answer %d\n",
              dir.c_str(), context, history, answer, question, answer);
  std::printf("%4s %9s %9s %7s %9s %9s %9s %6s %6s %9s %9s %6s\n", "conv", "dropped", "moved",
              "ttft_mv", "ttft_fr", "d1_mv", "d1_full", "top1mv", "top1fl", "agree_mv", "agree_fl",
              "cached");
  std::vector<double> ttft_moved, ttft_fresh, d_moved, d_full, agree_moved, agree_full;
  int top_moved = 0, top_full = 0;
  const int n = absl::GetFlag(FLAGS_conversations);
  for (int c = 0; c < n; ++c) {
    Deployment served(weights->get(), truncating, slots);
    std::vector<int32_t> conversation = RandomPrompt(history, 100 + c);
    auto earlier = served.Submit(Turn(conversation, answer));
    served.Wait({earlier});
    conversation.insert(conversation.end(), earlier->tokens.begin(), earlier->tokens.end());
    const auto q = RandomPrompt(question, 200 + c);
    conversation.insert(conversation.end(), q.begin(), q.end());
    const auto plan = PlanTruncation(static_cast<int64_t>(conversation.size()), answer, context,
                                     SchedulerConfig().context_keep_tokens, 16);
    if (!plan) {
      std::fprintf(stderr, "the conversation does not truncate\n");
      return 1;
    }
    const int64_t moved_before = served.scheduler().Stats().context_moved_tokens_total;
    // Interleaved: the order of moved and fresh alternates between conversations.
    Run moved, fresh;
    if (c % 2 == 0) {
      moved = Serve(served, Turn(conversation, answer));
      Deployment clean(weights->get(), truncating, slots);
      fresh = Serve(clean, Turn(Truncate(conversation, *plan), answer));
    } else {
      Deployment clean(weights->get(), truncating, slots);
      fresh = Serve(clean, Turn(Truncate(conversation, *plan), answer));
      moved = Serve(served, Turn(conversation, answer));
    }
    Deployment big(weights->get(), wide, 2 * slots);
    Run full = Serve(big, Turn(conversation, answer));
    const int64_t moved_tokens =
        served.scheduler().Stats().context_moved_tokens_total - moved_before;
    const double dm = FirstTokenDistance(*moved.outcome, *fresh.outcome);
    const double df = FirstTokenDistance(*full.outcome, *fresh.outcome);
    const int am = AgreeingPrefix(*moved.outcome, *fresh.outcome);
    const int af = AgreeingPrefix(*full.outcome, *fresh.outcome);
    const bool tm = am > 0, tf = af > 0;  // the first token agrees
    std::printf("%4d %9lld %9lld %7.3f %9.3f %9.4f %9.4f %6d %6d %9d %9d %6lld\n", c,
                static_cast<long long>(plan->dropped), static_cast<long long>(moved_tokens),
                moved.ttft_s, fresh.ttft_s, dm, df, tm ? 1 : 0, tf ? 1 : 0, am, af,
                static_cast<long long>(moved.outcome->cached_prompt_tokens));
    std::fflush(stdout);
    ttft_moved.push_back(moved.ttft_s);
    ttft_fresh.push_back(fresh.ttft_s);
    d_moved.push_back(dm);
    d_full.push_back(df);
    agree_moved.push_back(am);
    agree_full.push_back(af);
    top_moved += tm ? 1 : 0;
    top_full += tf ? 1 : 0;
  }
  std::printf(
      "medians over %d conversations: TTFT moved %.3f s, fresh prefill %.3f s (%.2fx); "
      "first-token |dlogprob| over the top 20 (where any is common): moved %.4f, untruncated "
      "%.4f; top token agrees: "
      "moved %d/%d, untruncated %d/%d; greedy tokens agreeing: moved %.0f, untruncated %.0f "
      "of %d\n",
      n, Median(ttft_moved), Median(ttft_fresh), Median(ttft_fresh) / Median(ttft_moved),
      Median(d_moved), Median(d_full), top_moved, n, top_full, n, Median(agree_moved),
      Median(agree_full), answer);
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Main();
}
