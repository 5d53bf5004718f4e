#include "common/bench/demo_model.h"

#include <filesystem>

#include "common/model/model_generator.h"

namespace strata {

absl::StatusOr<std::string> BenchModelDir(const std::string& flag) {
  if (!flag.empty()) return flag;
  const std::string dir = "/tmp/strata-bench-demo";
  if (!std::filesystem::exists(dir + "/config.json")) {
    absl::StatusOr<ModelConfig> shape = NamedModelShape("demo");
    if (!shape.ok()) return shape.status();
    if (absl::Status s = GenerateModel(*shape, {}, dir); !s.ok()) return s;
  }
  return dir;
}

}  // namespace strata
