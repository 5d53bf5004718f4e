// Versions a node reports at registration.
#ifndef STRATA_COMMON_CONTROL_VERSION_H_
#define STRATA_COMMON_CONTROL_VERSION_H_

#include <cstdint>

namespace strata {

// The control and data plane protocol; a node with another version is refused.
inline constexpr uint32_t kProtocolVersion = 3;
inline constexpr char kBuildVersion[] = "strata 0.1.0";

}  // namespace strata

#endif  // STRATA_COMMON_CONTROL_VERSION_H_
