// Normalizers of tokenizer.json ("normalizer"): Sequence, Prepend, Replace, NFC, NFD, NFKC,
// NFKD, Lowercase, Strip. Any other type is an error at load.
#ifndef STRATA_COMMON_TOKENIZER_NORMALIZER_H_
#define STRATA_COMMON_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8; so is the result.
  virtual std::string Normalize(std::string text) const = 0;
};

// Returns nullptr for a JSON null (no normalization).
absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const nlohmann::json& j);

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_NORMALIZER_H_
