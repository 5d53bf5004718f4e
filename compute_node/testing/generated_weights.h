// Test-only: a generated model (model_generator.h's named shapes, random weights), written
// to the test's temporary directory and loaded, for tests that run the real forward pass.
#ifndef STRATA_COMPUTE_NODE_TESTING_GENERATED_WEIGHTS_H_
#define STRATA_COMPUTE_NODE_TESTING_GENERATED_WEIGHTS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "compute_node/model_weights.h"

namespace strata {

// Generates the model `shape` (a NamedModelShape name) into $TEST_TMPDIR/`subdir` (/tmp
// outside Bazel), replacing what is there, and loads it. `num_layers` > 0 replaces the
// shape's layer count.
absl::StatusOr<std::unique_ptr<ModelWeights>> GenerateAndLoadWeights(const std::string& shape,
                                                                     const std::string& subdir,
                                                                     int num_layers = 0);

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_TESTING_GENERATED_WEIGHTS_H_
