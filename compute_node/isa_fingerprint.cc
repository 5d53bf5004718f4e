// isa_fingerprint: prints hashes of strata's CPU results on fixed inputs, so that two
// machines can be compared line by line. The determinism contract (docs/architecture.md,
// "Determinism") says that every node running the same ISA path computes the same bits;
// a deployment may mix machines (vendors, core counts) only where this tool prints the same
// lines on each.
//
//   isa_fingerprint [--isas=scalar,avx2,avx512,avx512bf16] [--model_shape=tiny-gqa|none]
//
// Lines: `cpu <model name>`, `threads <n>`, then per ISA path the CPU supports
// `<isa> <hash> <kernel>` for each kernel (kernels/cpu/fingerprint.h), `<isa> <hash>
// attention` and `<isa> <hash> all`; then, for the default path, `<isa> <hash> linear` (the
// linear layers' GEMM, oneDNN's or strata's: compute_node/linear.h) and `<isa> <hash>
// model <shape>`: the logits of a generated model over two prompts, prefilled together,
// then four greedy decode steps. A memory node registers with the attention hash, a
// compute node with `<all>-<linear>`. The model's random weights and its RoPE tables are
// made with libm, so the model line also compares the two machines' math libraries.
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "compute_node/attention_backend.h"
#include "compute_node/linear.h"
#include "compute_node/model_runner.h"
#include "compute_node/testing/generated_weights.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fingerprint.h"
#include "kernels/cpu/isa.h"

ABSL_FLAG(std::string, isas, "scalar,avx2,avx512,avx512bf16",
          "ISA paths to fingerprint (those the CPU lacks are skipped)");
ABSL_FLAG(std::string, model_shape, "tiny-gqa",
          "Generated model shape for the end-to-end line, on the default path; none to skip");

namespace strata {
namespace {

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const size_t begin = line.find_first_not_of(" \t", colon + 1);
      return begin == std::string::npos ? std::string() : line.substr(begin);
    }
  }
  return "unknown";
}

// Logits of two prompts (lengths 150 and 37) prefilled in one step, then four decode steps
// in which each sequence takes its greedy token; every logit enters the hash.
absl::StatusOr<uint64_t> ModelFingerprint(const std::string& shape) {
  auto weights = GenerateAndLoadWeights(shape, "isa_fingerprint_model");
  if (!weights.ok()) return weights.status();
  ModelRunner runner(weights->get(), /*max_positions=*/512);
  auto attention = LocalAttention::Create(runner.config(), /*num_slots=*/1024, /*prefault=*/false);
  if (!attention.ok()) return attention.status();
  const int64_t vocab = runner.config().vocab_size;

  struct Sequence {
    uint64_t id;
    std::vector<int32_t> tokens;
  };
  std::vector<Sequence> seqs = {{1, {}}, {2, {}}};
  uint64_t state = 7;
  for (int n : {150, 37}) {
    Sequence& s = seqs[n == 150 ? 0 : 1];
    for (int i = 0; i < n; ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      s.tokens.push_back(static_cast<int32_t>(3 + (state >> 33) % (vocab - 3)));
    }
  }
  uint64_t hash = kernels::FingerprintBytes(nullptr, 0);
  std::vector<int> done = {0, 0};  // positions already in the cache
  for (int step = 0; step < 5; ++step) {
    StepKvPlan plan;
    std::vector<int32_t> tokens;
    std::vector<int32_t> last_rows;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = seqs[i];
      const int start = done[i], end = static_cast<int>(s.tokens.size());
      SlotAssignment a;
      a.request_id = SequenceId(s.id);
      a.start = start;
      for (int p = start; p < end; ++p) {
        // Slots interleave the two sequences, as after allocation churn.
        a.slots.push_back(static_cast<int32_t>(2 * p + i));
        plan.rows.push_back({SequenceId(s.id), PoolIndex(0), p, -1});
        tokens.push_back(s.tokens[p]);
      }
      plan.assignments.push_back(a);
      last_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
      done[i] = end;
    }
    BatchBuffers b(runner.config(), static_cast<int64_t>(tokens.size()));
    absl::Status s = ForwardLayers(runner, **attention, b, plan, tokens.data());
    if (!s.ok()) return s;
    std::vector<float> logits(RowsCapacity(last_rows.size()) * vocab);
    runner.Logits(b, last_rows, logits.data());
    hash = kernels::FingerprintBytes(logits.data(), last_rows.size() * vocab * sizeof(float), hash);
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].tokens.push_back(
          static_cast<int32_t>(kernels::Argmax(vocab, logits.data() + i * vocab)));
    }
  }
  return hash;
}

int Main() {
  std::printf("cpu %s\nthreads %d\n", CpuModelName().c_str(), omp_get_max_threads());
  const kernels::CpuIsa default_isa = kernels::ActiveCpuIsa();
  for (kernels::CpuIsa isa : kernels::CpuIsasFromList(absl::GetFlag(FLAGS_isas))) {
    if (!kernels::ForceCpuIsa(isa)) continue;
    const char* name = kernels::CpuIsaName(isa);
    const std::vector<kernels::KernelFingerprint> fingerprints = kernels::KernelFingerprints();
    for (const kernels::KernelFingerprint& f : fingerprints) {
      std::printf("%s %s %s\n", name, kernels::FingerprintHex(f.hash).c_str(), f.kernel.c_str());
    }
    // What nodes report at registration (kernels::FingerprintsForRegistration).
    std::printf("%s %s attention\n", name,
                kernels::CombinedFingerprint(fingerprints, "attention").c_str());
    std::printf("%s %s all\n", name, kernels::CombinedFingerprint(fingerprints, "").c_str());
  }
  kernels::ForceCpuIsa(default_isa);
  std::printf("%s %s linear\n", kernels::CpuIsaName(default_isa), LinearFingerprint().c_str());
  const std::string shape = absl::GetFlag(FLAGS_model_shape);
  if (shape != "none") {
    absl::StatusOr<uint64_t> model = ModelFingerprint(shape);
    if (!model.ok()) {
      std::fprintf(stderr, "isa_fingerprint: model %s: %s\n", shape.c_str(),
                   model.status().ToString().c_str());
      return 1;
    }
    std::printf("%s %s model %s\n", kernels::CpuIsaName(default_isa),
                kernels::FingerprintHex(*model).c_str(), shape.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return strata::Main();
}
