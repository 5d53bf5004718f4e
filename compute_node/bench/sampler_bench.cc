// What drawing a token costs on the compute node (prints figures; no assertion): Sample on
// one thread, per row, for the sampling settings clients use, over logits shaped like a
// language model's (normal with a few strong candidates on top), at a vocabulary's size.
// Medians of interleaved rounds.
//
//   bazel build -c opt //compute_node/bench:sampler_bench
//   bazel-bin/compute_node/bench/sampler_bench [--vocab=32000,128256] [--rounds=7]
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/base/stopwatch.h"
#include "common/bench/int_list.h"
#include "common/bench/read_probe.h"
#include "compute_node/bench/sampling_settings.h"
#include "compute_node/sampler.h"

ABSL_FLAG(std::string, vocab, "32000,128256", "Vocabulary sizes, comma-separated");
ABSL_FLAG(int, rounds, 7, "Interleaved rounds");
ABSL_FLAG(int, rows, 64, "Rows (each its own logits) per setting and round");

namespace strata {
namespace {

// Normal logits (std 2) with eight strong candidates 6 to 10 above the mean.
std::vector<float> Logits(int vocab, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(vocab);
  for (float& x : v) x = normal(rng);
  std::uniform_int_distribution<int> pick(0, vocab - 1);
  for (int i = 0; i < 8; ++i) v[pick(rng)] = 6.0f + 0.5f * i;
  return v;
}

int Main() {
  const std::vector<SamplingSetting> settings = ClientSamplingSettings();
  std::printf("sampler: one thread, %d rows per setting and round, medians of %d rounds\n",
              absl::GetFlag(FLAGS_rows), absl::GetFlag(FLAGS_rounds));
  std::printf("%8s  %-34s %10s\n", "vocab", "setting", "us/row");
  for (int vocab : ParseIntList(absl::GetFlag(FLAGS_vocab))) {
    std::mt19937 rng(7);
    std::vector<std::vector<float>> rows;
    for (int r = 0; r < absl::GetFlag(FLAGS_rows); ++r) rows.push_back(Logits(vocab, rng));
    std::vector<std::vector<double>> times(settings.size());
    int64_t checksum = 0;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      for (size_t k = 0; k < settings.size(); ++k) {
        const size_t which = round % 2 == 0 ? k : settings.size() - 1 - k;
        SamplingParams params = settings[which].params;
        params.seed = 1234 + round;
        SampleInput in;
        in.params = &params;
        const Stopwatch watch;
        for (size_t r = 0; r < rows.size(); ++r) {
          in.output_position = static_cast<int64_t>(r);
          checksum += Sample(rows[r].data(), vocab, in).token;
        }
        times[which].push_back(watch.ElapsedSeconds() * 1e6 / static_cast<double>(rows.size()));
      }
    }
    for (size_t k = 0; k < settings.size(); ++k) {
      std::printf("%8d  %-34s %10.2f\n", vocab, settings[k].name, Median(times[k]));
    }
    if (checksum == -1) std::printf("unreachable\n");  // keeps the draws
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Main();
}
