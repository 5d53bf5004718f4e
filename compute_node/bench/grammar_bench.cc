// Structured output's cost in a decode step (prints figures; no assertion): the token-mask
// work of a batch of B sequences, each under its own JSON Schema (B different schemas,
// compiled once, each sequence some tokens into its output), against the decode step of the
// same batch on the same model and threads, in interleaved rounds (medians).
//
//   bazel build -c opt //compute_node/bench:grammar_bench
//   bazel-bin/compute_node/bench/grammar_bench --model=DIR [--batch=32] [--ctx=256]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/base/stopwatch.h"
#include "common/bench/median.h"
#include "common/grammar/grammar.h"
#include "common/grammar/json_schema.h"
#include "common/tokenizer/tokenizer.h"
#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"
#include "compute_node/structured_output.h"

ABSL_FLAG(std::string, model, "", "Model directory (with tokenizer.json)");
ABSL_FLAG(int, batch, 32, "Rows, each with its own schema");
ABSL_FLAG(int, ctx, 256, "Context of every row");
ABSL_FLAG(int, rounds, 5, "Interleaved rounds");
ABSL_FLAG(int, iters, 4, "Steps per round");

namespace strata {
namespace {

// Real-world shapes, made distinct per row by their property names.
std::string Schema(int i) {
  const std::string s = std::to_string(i);
  switch (i % 4) {
    case 0:
      return R"({"type":"object","properties":{"name)" + s +
             R"(":{"type":"string","maxLength":20},"age":{"type":"integer","minimum":0,"maximum":120},"email":{"type":"string","format":"email"}},"required":["name)" +
             s + R"(","age"]})";
    case 1:
      return R"({"type":"object","properties":{"items)" + s +
             R"(":{"type":"array","maxItems":5,"items":{"type":"object","properties":{"sku":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{4}$"},"qty":{"type":"integer","minimum":1,"maximum":99}},"required":["sku","qty"]}},"total":{"type":"number","minimum":0}},"required":["items)" +
             s + R"("]})";
    case 2:
      return R"({"type":"object","properties":{"city)" + s +
             R"(":{"type":"string"},"date":{"type":"string","format":"date"},"sky":{"enum":["clear","cloudy","rain"]},"temp":{"type":"integer","minimum":-60,"maximum":60}},"required":["city)" +
             s + R"(","date","sky"]})";
    default:
      return R"({"$defs":{"n":{"type":"object","properties":{"label)" + s +
             R"(":{"type":"string","maxLength":8},"kids":{"type":"array","maxItems":3,"items":{"$ref":"#/$defs/n"}}},"required":["label)" +
             s + R"("]}},"$ref":"#/$defs/n"})";
  }
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  auto config = LoadModelConfig(dir);
  auto tokenizer = Tokenizer::Load(dir);
  if (!config.ok() || !tokenizer.ok()) {
    std::fprintf(stderr, "grammar_bench: --model must be a model directory with a tokenizer\n");
    return 2;
  }
  auto weights = ModelWeights::Load(dir, *config);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  const ModelConfig& c = *config;
  const int batch = absl::GetFlag(FLAGS_batch), ctx = absl::GetFlag(FLAGS_ctx);
  std::vector<int32_t> ends(c.eos_token_ids.begin(), c.eos_token_ids.end());
  auto vocab = MakeGrammarVocabulary(**tokenizer, ends);

  // Each row: its own schema, matched twice in step, with and without the mask cache (the
  // same tokens fed to both), some tokens into an output.
  std::mt19937 rng(1);
  std::vector<std::shared_ptr<const grammar::Grammar>> grammars;
  const Stopwatch compile_watch;
  for (int i = 0; i < batch; ++i) {
    auto gbnf = grammar::JsonSchemaGrammar(Schema(i));
    auto g = gbnf.ok() ? grammar::Grammar::Parse(*gbnf) : gbnf.status();
    if (!g.ok()) {
      std::fprintf(stderr, "schema %d: %s\n", i, std::string(g.status().message()).c_str());
      return 1;
    }
    grammars.push_back(*g);
  }
  const double compile_ms = compile_watch.ElapsedSeconds() * 1e3 / batch;
  std::vector<std::shared_ptr<MaskCache>> caches;
  std::vector<std::unique_ptr<SequenceGrammar>> cached(batch), plain(batch);
  std::vector<int64_t> position(batch, 0);
  auto restart = [&](int i) {
    cached[i] =
        std::make_unique<SequenceGrammar>(CompiledGrammar{grammars[i], caches[i]}, vocab.get(), 0);
    plain[i] =
        std::make_unique<SequenceGrammar>(CompiledGrammar{grammars[i], nullptr}, vocab.get(), 0);
    position[i] = 0;
  };
  // Feeds row i a random token its mask allows (restarting it when only the end is left).
  auto feed_random = [&](int i, const std::vector<uint64_t>& mask) {
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < static_cast<int32_t>(vocab->vocabulary.size()); ++t) {
      if (grammar::MaskHas(mask, t) && !vocab->vocabulary.token(t).empty()) allowed.push_back(t);
    }
    if (allowed.empty()) return restart(i);
    const int32_t t = allowed[rng() % allowed.size()];
    (void)cached[i]->Feed(t, position[i]);
    (void)plain[i]->Feed(t, position[i]);
    ++position[i];
  };
  for (int i = 0; i < batch; ++i) {
    caches.push_back(std::make_shared<MaskCache>());
    restart(i);
    const int walk = rng() % 24;
    for (int k = 0; k < walk; ++k) feed_random(i, **plain[i]->Allowed(position[i]));
  }

  // The decode step: embedding, every layer with attention over ctx positions, logits.
  ModelRunner runner(weights->get(), ctx + 16);
  auto local = LocalAttention::Create(c, static_cast<int64_t>(batch) * (ctx + 16), true);
  StepKvPlan setup;
  for (int b = 0; b < batch; ++b) {
    SlotAssignment a;
    a.request_id = SequenceId(b + 1);
    for (int p = 0; p < ctx + 16; ++p) a.slots.push_back(b * (ctx + 16) + p);
    setup.assignments.push_back(a);
  }
  (void)(*local)->BeginStep(setup);
  BatchBuffers buffers(c, batch);
  std::vector<int32_t> tokens(batch, 100), pos(batch, ctx), last(batch);
  for (int i = 0; i < batch; ++i) last[i] = i;
  std::vector<float> logits(static_cast<size_t>(batch) * c.vocab_size);
  StepKvPlan plan;
  for (int i = 0; i < batch; ++i) {
    plan.rows.push_back({SequenceId(static_cast<uint64_t>(i + 1)), PoolIndex(0), ctx, -1});
  }
  (void)(*local)->BeginStep(plan);
  auto step = [&] {
    runner.Embed(buffers, batch, tokens.data(), pos.data());
    for (int l = 0; l < c.num_layers; ++l) {
      runner.PreAttention(buffers, batch, l);
      (void)(*local)->Attend(l, buffers, batch);
      runner.PostAttention(buffers, batch, l);
    }
    runner.Logits(buffers, last, logits.data());
  };
  // The masks, spread over the threads as the step engine spreads its draws; then every
  // row takes a token, as after a draw.
  std::vector<TokenMask> plain_masks(batch), cached_masks(batch);
  auto masks_of = [&](std::vector<std::unique_ptr<SequenceGrammar>>& rows,
                      std::vector<TokenMask>* out) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < batch; ++i) (*out)[i] = *rows[i]->Allowed(position[i]);
  };
  step();
  std::vector<double> steps, plain_times, cached_times;
  int64_t allowed = 0, mismatches = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (int it = 0; it < absl::GetFlag(FLAGS_iters); ++it) {
      Stopwatch watch;
      step();
      steps.push_back(watch.ElapsedSeconds());
      watch.Reset();
      masks_of(plain, &plain_masks);
      plain_times.push_back(watch.ElapsedSeconds());
      watch.Reset();
      masks_of(cached, &cached_masks);
      cached_times.push_back(watch.ElapsedSeconds());
      for (int i = 0; i < batch; ++i) {
        mismatches += *plain_masks[i] != *cached_masks[i];
        for (uint64_t w : *plain_masks[i]) allowed += __builtin_popcountll(w);
        feed_random(i, *plain_masks[i]);
      }
    }
  }
  int64_t hits = 0, misses = 0;
  for (const auto& c : caches) {
    hits += c->hits();
    misses += c->misses();
  }
  const double step_ms = Median(steps) * 1e3, plain_ms = Median(plain_times) * 1e3,
               cached_ms = Median(cached_times) * 1e3;
  std::printf(
      "grammar bench: %s, vocabulary %zu, batch %d with %d different schemas, ctx %d, %d "
      "threads\n",
      dir.c_str(), vocab->vocabulary.size(), batch, batch, ctx, omp_get_max_threads());
  std::printf("schema compile (JSON Schema -> GBNF -> grammar): %.2f ms per schema\n", compile_ms);
  std::printf(
      "decode step %.2f ms; masks per step: %.2f ms without the mask cache (%.3f of the step), "
      "%.2f ms with it (%.3f of the step; %.0f%% hits); medians of %zu interleaved steps, each "
      "row taking a random allowed token after each; %.0f allowed tokens per row on average; "
      "%lld cached masks differed from computed ones\n",
      step_ms, plain_ms, plain_ms / step_ms, cached_ms, cached_ms / step_ms,
      100.0 * hits / std::max<int64_t>(1, hits + misses), steps.size(),
      static_cast<double>(allowed) / (batch * steps.size()), static_cast<long long>(mismatches));
  return mismatches == 0 ? 0 : 1;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Run();
}
