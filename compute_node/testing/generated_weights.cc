#include "compute_node/testing/generated_weights.h"

#include <cstdlib>
#include <filesystem>

#include "common/base/status_macros.h"
#include "common/model/model_config.h"
#include "common/model/model_generator.h"

namespace strata {

absl::StatusOr<std::unique_ptr<ModelWeights>> GenerateAndLoadWeights(const std::string& shape,
                                                                     const std::string& subdir,
                                                                     int num_layers) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + subdir;
  std::filesystem::remove_all(dir);
  ASSIGN_OR_RETURN(ModelConfig generated, NamedModelShape(shape));
  if (num_layers > 0) generated.num_layers = num_layers;
  RETURN_IF_ERROR(GenerateModel(generated, {}, dir));
  ASSIGN_OR_RETURN(const ModelConfig loaded, LoadModelConfig(dir));
  return ModelWeights::Load(dir, loaded);
}

}  // namespace strata
