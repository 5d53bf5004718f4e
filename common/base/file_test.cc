#include "common/base/file.h"

#include <errno.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string TestPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/file_test-", getpid(), "-", name);
}

TEST(ReadFileToString, ReadsEveryByteOfAFileLargerThanOneRead) {
  // Bytes of every value, NULs included, over several reads of the buffer.
  std::string want;
  for (int i = 0; i < 300 * 1024 + 7; ++i) want.push_back(static_cast<char>((i * 131) % 256));
  const std::string path = TestPath("large");
  std::ofstream(path, std::ios::binary) << want;
  const auto got = ReadFileToString(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), want.size());
  EXPECT_TRUE(*got == want);
  fs::remove(path);
}

TEST(ReadFileToString, AnEmptyFileIsAnEmptyString) {
  const std::string path = TestPath("empty");
  std::ofstream(path).close();
  const auto got = ReadFileToString(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");
  fs::remove(path);
}

TEST(ReadFileToString, ReadsProcFilesWhoseSizeIsZero) {
  // /proc files report st_size 0; the reader must go to the end regardless.
  const auto got = ReadFileToString("/proc/self/status");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NE(got->find("Name:"), std::string::npos);
  EXPECT_NE(got->find("Pid:"), std::string::npos);
}

TEST(ReadFileToString, AMissingFileIsNotFoundAndNamesThePath) {
  const std::string path = TestPath("missing");
  const auto got = ReadFileToString(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find(path + ": cannot open"), std::string::npos) << got.status();
}

TEST(ReadFileToString, ADirectoryIsRefusedInsteadOfReadingAsEmpty) {
  const std::string path = TestPath("dir");
  fs::create_directories(path);
  const auto got = ReadFileToString(path);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(got.status().message().find(path + ": is a directory"), std::string::npos)
      << got.status();
  fs::remove(path);
}

TEST(ReadFileToString, AnErrorPartWayIsReportedNotTruncated) {
  // Reading /proc/self/mem from offset 0 fails with EIO (page 0 is never mapped).
  const auto got = ReadFileToString("/proc/self/mem");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(got.status().message().find("/proc/self/mem: read failed"), std::string::npos)
      << got.status();
}

TEST(ErrnoToStatus, CodesFollowTheError) {
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "w").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EDQUOT, "w").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "w").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EACCES, "w").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(EPERM, "w").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(EIO, "w").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write /x").message(), "write /x: No space left on device");
}

}  // namespace
}  // namespace strata
