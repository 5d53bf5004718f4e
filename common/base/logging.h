// Leveled logging and CHECK macros for every strata process.
//
// Abseil 20220623 has no logging library, so strata keeps this small one. A log line is
// written with a single write(2), so lines from different threads never interleave:
//
//   I1122 10:59:01.123456 4242 scheduler.cc:88] req-7 admitted on memory node 1
//
// LOG(FATAL) and a failed CHECK print the line and abort. CHECK is for broken
// invariants (our bugs), never for bad input or peer failures: those return a Status.
#ifndef STRATA_COMMON_BASE_LOGGING_H_
#define STRATA_COMMON_BASE_LOGGING_H_

#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>

namespace strata {

enum class LogSeverity : int { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

// Lines below this severity are dropped. Default kInfo; STRATA_LOG_LEVEL=warning etc.
// overrides it at start-up, and SetMinLogSeverity at any time (thread-safe).
void SetMinLogSeverity(LogSeverity severity);
LogSeverity MinLogSeverity();

// Prefixes every line with "[tag] " (e.g. the process role); set once in main().
void SetLogTag(const std::string& tag);

namespace logging_internal {

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Swallows the stream in the disabled branch of LOG_IF-style macros.
struct Voidify {
  void operator&(std::ostream&) {}
};

bool ShouldLog(LogSeverity severity);

// True for the first `n` calls at one call site (the counter lives at the site).
inline bool FirstN(std::atomic<int64_t>& counter, int64_t n) {
  return counter.fetch_add(1, std::memory_order_relaxed) < n;
}

}  // namespace logging_internal
}  // namespace strata

#define STRATA_LOG_SEVERITY_INFO ::strata::LogSeverity::kInfo
#define STRATA_LOG_SEVERITY_WARNING ::strata::LogSeverity::kWarning
#define STRATA_LOG_SEVERITY_ERROR ::strata::LogSeverity::kError
#define STRATA_LOG_SEVERITY_FATAL ::strata::LogSeverity::kFatal

#define LOG(severity)                                                              \
  !::strata::logging_internal::ShouldLog(STRATA_LOG_SEVERITY_##severity)           \
      ? (void)0                                                                    \
      : ::strata::logging_internal::Voidify() &                                    \
            ::strata::logging_internal::LogMessage(__FILE__, __LINE__,             \
                                                   STRATA_LOG_SEVERITY_##severity) \
                .stream()

#define LOG_IF(severity, condition) !(condition) ? (void)0 : LOG(severity)

// Logs the first n occurrences at this call site, then stays quiet.
#define LOG_FIRST_N(severity, n)                                \
  static std::atomic<int64_t> strata_log_first_n_##__LINE__{0}; \
  if (::strata::logging_internal::FirstN(strata_log_first_n_##__LINE__, (n))) LOG(severity)

#define CHECK(condition)                                                                  \
  (condition) ? (void)0                                                                   \
              : ::strata::logging_internal::Voidify() &                                   \
                    ::strata::logging_internal::LogMessage(__FILE__, __LINE__,            \
                                                           ::strata::LogSeverity::kFatal) \
                            .stream()                                                     \
                        << "Check failed: " #condition " "

#define STRATA_CHECK_OP(a, b, op)                                                        \
  ((a)op(b)) ? (void)0                                                                   \
             : ::strata::logging_internal::Voidify() &                                   \
                   ::strata::logging_internal::LogMessage(__FILE__, __LINE__,            \
                                                          ::strata::LogSeverity::kFatal) \
                           .stream()                                                     \
                       << "Check failed: " #a " " #op " " #b " (" << (a) << " vs " << (b) << ") "

#define CHECK_EQ(a, b) STRATA_CHECK_OP(a, b, ==)
#define CHECK_NE(a, b) STRATA_CHECK_OP(a, b, !=)
#define CHECK_LT(a, b) STRATA_CHECK_OP(a, b, <)
#define CHECK_LE(a, b) STRATA_CHECK_OP(a, b, <=)
#define CHECK_GT(a, b) STRATA_CHECK_OP(a, b, >)
#define CHECK_GE(a, b) STRATA_CHECK_OP(a, b, >=)

// CHECK that an absl::Status (or StatusOr) is OK.
#define CHECK_OK(expr)                                            \
  do {                                                            \
    const auto& strata_check_ok_status = (expr);                  \
    CHECK(strata_check_ok_status.ok()) << strata_check_ok_status; \
  } while (0)

#endif  // STRATA_COMMON_BASE_LOGGING_H_
