#include "common/base/logging.h"

#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace strata {
namespace {

LogSeverity SeverityFromEnv() {
  const char* env = std::getenv("STRATA_LOG_LEVEL");
  if (env == nullptr) return LogSeverity::kInfo;
  if (strcasecmp(env, "warning") == 0) return LogSeverity::kWarning;
  if (strcasecmp(env, "error") == 0) return LogSeverity::kError;
  if (strcasecmp(env, "fatal") == 0) return LogSeverity::kFatal;
  return LogSeverity::kInfo;
}

std::atomic<int>& MinSeverityStorage() {
  static std::atomic<int> min_severity{static_cast<int>(SeverityFromEnv())};
  return min_severity;
}

std::mutex tag_mu;
std::string& TagStorage() {
  static std::string* tag = new std::string;
  return *tag;
}

const char* Basename(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash == nullptr ? path : slash + 1;
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  MinSeverityStorage().store(static_cast<int>(severity), std::memory_order_relaxed);
}

LogSeverity MinLogSeverity() {
  return static_cast<LogSeverity>(MinSeverityStorage().load(std::memory_order_relaxed));
}

void SetLogTag(const std::string& tag) {
  std::lock_guard<std::mutex> lock(tag_mu);
  TagStorage() = tag.empty() ? "" : "[" + tag + "] ";
}

namespace logging_internal {

bool ShouldLog(LogSeverity severity) {
  return static_cast<int>(severity) >= MinSeverityStorage().load(std::memory_order_relaxed);
}

LogMessage::LogMessage(const char* file, int line, LogSeverity severity) : severity_(severity) {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm local;
  localtime_r(&tv.tv_sec, &local);
  char prefix[96];
  static constexpr char kLetters[] = "IWEF";
  snprintf(prefix, sizeof(prefix), "%c%02d%02d %02d:%02d:%02d.%06ld %ld %s:%d] ",
           kLetters[static_cast<int>(severity)], local.tm_mon + 1, local.tm_mday, local.tm_hour,
           local.tm_min, local.tm_sec, static_cast<long>(tv.tv_usec),
           static_cast<long>(syscall(SYS_gettid)), Basename(file), line);
  {
    std::lock_guard<std::mutex> lock(tag_mu);
    stream_ << TagStorage();
  }
  stream_ << prefix;
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  // One write per line keeps concurrent lines whole; a short write is not retried.
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  if (severity_ == LogSeverity::kFatal) abort();
}

}  // namespace logging_internal
}  // namespace strata
