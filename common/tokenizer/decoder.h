// Decoders of tokenizer.json ("decoder"): Sequence, ByteLevel, Replace, ByteFallback, Fuse,
// Strip, Metaspace. Any other type is an error at load. A decoder chain turns the token
// strings of a sequence into text; strata's chain yields raw bytes (byte tokens may form
// invalid UTF-8), which the tokenizer sanitises to valid UTF-8 at the end.
#ifndef STRATA_COMMON_TOKENIZER_DECODER_H_
#define STRATA_COMMON_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings in place (some decoders join them into one).
  virtual void Decode(std::vector<std::string>& tokens) const = 0;
};

// Returns nullptr for a JSON null (token strings are concatenated as they are).
absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const nlohmann::json& j);

}  // namespace strata

#endif  // STRATA_COMMON_TOKENIZER_DECODER_H_
