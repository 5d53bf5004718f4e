// Many concurrent streaming requests from one thread: non-blocking sockets on epoll, so
// that a test or benchmark can hold a thousand Server-Sent-Event streams open against the
// server and see, per stream, how many events arrived and the longest gap between them.
#ifndef STRATA_TESTS_COMMON_STREAM_FANOUT_H_
#define STRATA_TESTS_COMMON_STREAM_FANOUT_H_

#include <functional>
#include <string>
#include <vector>

namespace strata::testing {

struct StreamStats {
  int status = -1;            // HTTP status; -1: no response
  int events = 0;             // "data:" events, [DONE] included
  bool done = false;          // saw "data: [DONE]"
  double first_event_s = -1;  // from connect
  double max_gap_s = 0;       // longest wait between consecutive reads with events
  double end_s = -1;
};

struct FanoutOptions {
  int port = 0;
  int streams = 1000;
  std::string path = "/v1/completions";
  std::function<std::string(int index)> body;  // JSON body of stream i
  double timeout_s = 300;
  // Called about every `tick_s` while streams run (e.g. to sample RSS or send a request).
  std::function<void(double elapsed_s, int open_streams)> on_tick;
  double tick_s = 0.5;
};

// Runs every stream to its end (or the timeout). Raises RLIMIT_NOFILE as needed.
std::vector<StreamStats> RunFanout(const FanoutOptions& options);

// Resident set size of a process, bytes (from /proc/PID/status); -1 if unknown.
long long RssBytes(int pid);

// Raises this process's open-file soft limit to at least `n` (up to the hard limit);
// children started afterwards inherit it. Returns the new soft limit.
long long RaiseOpenFileLimit(long long n);

}  // namespace strata::testing

#endif  // STRATA_TESTS_COMMON_STREAM_FANOUT_H_
