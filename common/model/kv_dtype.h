// Element types of the KV cache, and their names on command lines, in the control plane's
// messages and in kernel fingerprints. Here rather than in kernels/ so that the server,
// which checks a deployment's nodes agree on it but runs no kernel, spells them from the
// same table.
#ifndef STRATA_COMMON_MODEL_KV_DTYPE_H_
#define STRATA_COMMON_MODEL_KV_DTYPE_H_

#include "common/base/enum_names.h"

namespace strata {

enum class KvDType : int { kBF16 = 0, kF16 = 1 };
// Their names (EnumNameOf, ParseEnumName).
inline constexpr EnumName<KvDType> kKvDTypeNames[] = {{KvDType::kBF16, "bf16"},
                                                      {KvDType::kF16, "f16"}};

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_KV_DTYPE_H_
