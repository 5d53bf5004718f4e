// Versions a node reports at registration.
#ifndef STRATA_COMMON_CONTROL_VERSION_H_
#define STRATA_COMMON_CONTROL_VERSION_H_

#include <cstdint>

namespace strata {

// The control protocol (proto/control.proto); a node with another version is refused. The
// data plane has a version of its own (kDataPlaneVersion, common/transport/handshake.h),
// which nodes report at registration too.
inline constexpr uint32_t kProtocolVersion = 3;
inline constexpr char kBuildVersion[] = "strata 0.1.0";

}  // namespace strata

#endif  // STRATA_COMMON_CONTROL_VERSION_H_
