#include "common/base/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {

absl::Status ErrnoToStatus(int error, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  if (error == ENOSPC || error == EDQUOT) return absl::ResourceExhaustedError(message);
  if (error == ENOENT) return absl::NotFoundError(message);
  if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, path + ": cannot open");
  struct stat st;
  const bool known = fstat(fd, &st) == 0;
  if (known && S_ISDIR(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(path + ": is a directory");
  }
  std::string text;
  // A regular file's size is a good first guess; /proc and /sys files say 0 or 4096.
  if (known && S_ISREG(st.st_mode) && st.st_size > 0) {
    text.reserve(static_cast<size_t>(st.st_size));
  }
  char buffer[64 * 1024];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      close(fd);
      return ErrnoToStatus(error, path + ": read failed");
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

}  // namespace strata
