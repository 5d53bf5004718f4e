// Reading a whole file, and errno as a Status: the one place for both, so that every reader
// of a config, tokenizer, secret, cgroup or fingerprint file reports the same clear errors.
#ifndef STRATA_COMMON_BASE_FILE_H_
#define STRATA_COMMON_BASE_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

// `what`: strerror(error), under the code that fits the error: ResourceExhausted for a full
// disk or quota (ENOSPC, EDQUOT), NotFound for ENOENT, PermissionDenied for EACCES and
// EPERM, Internal otherwise.
absl::Status ErrnoToStatus(int error, const std::string& what);

// The whole contents of the file at `path`, read to its end (files of /proc and /sys report
// a size of 0 or a page and are read all the same). Errors name the path:
//   NotFound          "PATH: cannot open: No such file or directory"
//   PermissionDenied  "PATH: cannot open: Permission denied"
//   FailedPrecondition "PATH: is a directory"
//   Internal          "PATH: read failed: ..." (an I/O error part-way)
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace strata

#endif  // STRATA_COMMON_BASE_FILE_H_
