// forward_dump: runs a prompt plus greedy decode steps through the co-located forward pass
// and writes what the numpy reference (tests/reference/llama_reference.py) checks:
//   <out>.json  {"tokens": [...], "positions": [...]}  all tokens, and the positions whose
//               next-token distribution was recorded
//   <out>.npy   float32 [len(positions)][vocab] log-softmax of the logits at those positions
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/model/model_config.h"
#include "compute_node/attention_backend.h"
#include "compute_node/model_runner.h"
#include "compute_node/model_weights.h"

ABSL_FLAG(std::string, model, "", "Model directory");
ABSL_FLAG(std::string, out, "", "Output path prefix");
ABSL_FLAG(int, prompt_len, 40, "Random prompt length (ignored with --prompt_tokens)");
ABSL_FLAG(std::string, prompt_tokens, "", "Comma-separated prompt token ids");
ABSL_FLAG(int, decode_steps, 8, "Greedy decode steps");
ABSL_FLAG(int, chunk, 0, "Prefill chunk size in tokens (0: the whole prompt at once)");
ABSL_FLAG(uint32_t, seed, 1, "Seed of the random prompt");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16", "The KV cache's element type: bf16 or f16");

namespace strata {
namespace {

int Fail(const std::string& message) {
  std::cerr << "forward_dump: " << message << "\n";
  return 1;
}

void WriteNpy(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + ", " + std::to_string(cols) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  auto config = LoadModelConfig(dir);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  auto kv = ParseKvCacheType(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!kv.ok()) return Fail(std::string(kv.status().message()));
  config->kv_cache_dtype = *kv;
  auto weights = ModelWeights::Load(dir, *config);
  if (!weights.ok()) return Fail(std::string(weights.status().message()));

  std::vector<int32_t> tokens;
  if (!absl::GetFlag(FLAGS_prompt_tokens).empty()) {
    for (absl::string_view piece : absl::StrSplit(absl::GetFlag(FLAGS_prompt_tokens), ',')) {
      int32_t t;
      if (!absl::SimpleAtoi(piece, &t)) return Fail("bad token id");
      tokens.push_back(t);
    }
  } else {
    std::mt19937 rng(absl::GetFlag(FLAGS_seed));
    std::uniform_int_distribution<int32_t> dist(3, static_cast<int32_t>(config->vocab_size) - 1);
    for (int i = 0; i < absl::GetFlag(FLAGS_prompt_len); ++i) tokens.push_back(dist(rng));
  }
  const int steps = absl::GetFlag(FLAGS_decode_steps);
  const int64_t max_len = static_cast<int64_t>(tokens.size()) + steps + 1;
  ModelRunner runner(weights->get(), max_len);
  auto attention = LocalAttention::Create(*config, max_len, /*prefault=*/false);
  if (!attention.ok()) return Fail(std::string(attention.status().message()));

  const int64_t vocab = config->vocab_size;
  const int chunk =
      absl::GetFlag(FLAGS_chunk) > 0 ? absl::GetFlag(FLAGS_chunk) : static_cast<int>(tokens.size());
  BatchBuffers buffers(*config, std::max<int64_t>(chunk, 1));
  std::vector<float> logits(RowsCapacity(1) * vocab);
  std::vector<float> recorded;
  std::vector<int64_t> positions;

  // Slot of position p is p: one request, table grown as it goes.
  auto run = [&](int32_t start, int32_t count, bool assign) -> absl::Status {
    StepKvPlan plan;
    if (assign) {
      SlotAssignment a;
      a.request_id = SequenceId(1);
      a.start = start;
      for (int32_t p = start; p < start + count; ++p) a.slots.push_back(p);
      plan.assignments.push_back(a);
    }
    for (int32_t p = start; p < start + count; ++p)
      plan.rows.push_back({SequenceId(1), PoolIndex(0), p, -1});
    return ForwardLayers(runner, **attention, buffers, plan, tokens.data() + start);
  };
  auto record_last = [&](int32_t rows) {
    runner.Logits(buffers, {rows - 1}, logits.data());
    double max_logit = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i) max_logit = std::max<double>(max_logit, logits[i]);
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max_logit);
    const double log_z = max_logit + std::log(sum);
    int32_t best = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      recorded.push_back(static_cast<float>(logits[i] - log_z));
      if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
    }
    return best;
  };

  const int32_t prompt_len = static_cast<int32_t>(tokens.size());
  int32_t next = 0;
  for (int32_t start = 0; start < prompt_len; start += chunk) {
    const int32_t count = std::min(chunk, prompt_len - start);
    absl::Status s = run(start, count, true);
    if (!s.ok()) return Fail(std::string(s.message()));
    if (start + count == prompt_len) {
      positions.push_back(prompt_len - 1);
      next = record_last(count);
    }
  }
  for (int step = 0; step < steps; ++step) {
    const int32_t pos = static_cast<int32_t>(tokens.size());
    tokens.push_back(next);
    absl::Status s = run(pos, 1, true);
    if (!s.ok()) return Fail(std::string(s.message()));
    positions.push_back(pos);
    next = record_last(1);
  }

  const std::string out = absl::GetFlag(FLAGS_out);
  WriteNpy(out + ".npy", recorded, static_cast<int64_t>(positions.size()), vocab);
  std::ofstream meta(out + ".json");
  meta << "{\"tokens\": [";
  for (size_t i = 0; i < tokens.size(); ++i) meta << (i ? ", " : "") << tokens[i];
  meta << "], \"positions\": [";
  for (size_t i = 0; i < positions.size(); ++i) meta << (i ? ", " : "") << positions[i];
  meta << "]}\n";
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_model).empty() || absl::GetFlag(FLAGS_out).empty()) {
    std::cerr << "usage: forward_dump --model=DIR --out=PREFIX\n";
    return 2;
  }
  return strata::Run();
}
