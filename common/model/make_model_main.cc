// make_model: writes a deterministic random-weight model in Hugging Face layout.
//
//   make_model --shape=demo --out=/path/to/dir [--seed=0] [--shards=1] [--dtype=bf16]
//              [--tokenizer_dir=DIR]
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/base/logging.h"
#include "common/model/model_generator.h"

ABSL_FLAG(std::string, shape, "tiny",
          "Named shape: tiny, tiny-gqa, tiny-qwen, tiny-mistral, demo, demo-gqa");
ABSL_FLAG(std::string, out, "", "Output directory (required)");
ABSL_FLAG(uint64_t, seed, 0, "Random seed");
ABSL_FLAG(int, shards, 1, "Number of safetensors shards");
ABSL_FLAG(std::string, dtype, "", "Checkpoint dtype: bf16, f16 or f32 (default: the shape's)");
ABSL_FLAG(std::string, tokenizer_dir, "", "Directory with tokenizer.json to copy in");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_out).empty()) {
    std::cerr << "make_model: --out is required\n";
    return 2;
  }
  auto shape = strata::NamedModelShape(absl::GetFlag(FLAGS_shape));
  if (!shape.ok()) {
    std::cerr << "make_model: " << shape.status().message() << "\n";
    return 2;
  }
  strata::GenerateOptions options;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.num_shards = absl::GetFlag(FLAGS_shards);
  options.tokenizer_dir = absl::GetFlag(FLAGS_tokenizer_dir);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (!dtype.empty()) {
    options.dtype = strata::ParseDType(dtype == "bf16"  ? "BF16"
                                       : dtype == "f16" ? "F16"
                                       : dtype == "f32" ? "F32"
                                                        : dtype);
    if (!options.dtype) {
      std::cerr << "make_model: --dtype must be bf16, f16 or f32\n";
      return 2;
    }
  }
  absl::Status status = strata::GenerateModel(*shape, options, absl::GetFlag(FLAGS_out));
  if (!status.ok()) {
    std::cerr << "make_model: " << status.message() << "\n";
    return 1;
  }
  std::cout << "wrote " << absl::GetFlag(FLAGS_shape) << " model (" << shape->NumParameters()
            << " parameters before vocabulary adjustment) to " << absl::GetFlag(FLAGS_out) << "\n";
  return 0;
}
