// Element types of checkpoint tensors and of runtime buffers.
#ifndef STRATA_COMMON_MODEL_DTYPE_H_
#define STRATA_COMMON_MODEL_DTYPE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

enum class DType { kF32, kF16, kBF16 };

inline size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// Safetensors spelling: "F32", "F16", "BF16".
inline const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

// Accepts the safetensors names and the torch_dtype names of config.json.
inline std::optional<DType> ParseDType(std::string_view name) {
  if (name == "F32" || name == "float32" || name == "float") return DType::kF32;
  if (name == "F16" || name == "float16" || name == "half") return DType::kF16;
  if (name == "BF16" || name == "bfloat16") return DType::kBF16;
  return std::nullopt;
}

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_DTYPE_H_
