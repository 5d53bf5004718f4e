// A timeline of what a process was busy with, for the pipeline's timeline: which node runs
// which batch and layer, when. Written as Chrome trace JSON (chrome://tracing or
// ui.perfetto.dev): complete events on named tracks, with microsecond timestamps on the
// wall clock, so that the files of processes on one machine line up.
//
// Thread-safety: thread-safe.
#ifndef STRATA_COMMON_BASE_TRACE_H_
#define STRATA_COMMON_BASE_TRACE_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace strata {

class TraceRecorder {
 public:
  // Keeps the first `max_events` events; later ones are counted and dropped.
  TraceRecorder(std::string process_name, size_t max_events);

  // Names a track (a row of the timeline), e.g. "lane 0".
  void NameTrack(int track, std::string name);
  // Records [start, start + duration) on `track`.
  void Add(int track, std::string name, absl::Time start, absl::Duration duration);
  size_t size() const;
  uint64_t dropped() const;

  // The events as Chrome trace JSON.
  std::string ToJson() const;
  // Writes ToJson() to `path`.
  absl::Status Write(const std::string& path) const;

 private:
  struct Event {
    int track;
    std::string name;
    int64_t start_us;
    int64_t duration_us;
  };
  const std::string process_name_;
  const size_t max_events_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::map<int, std::string> tracks_;
  uint64_t dropped_ = 0;
};

// Records its own lifetime on a track; a null recorder records nothing.
class TraceSpan {
 public:
  TraceSpan(TraceRecorder* recorder, int track, std::string name)
      : recorder_(recorder), track_(track), name_(std::move(name)) {
    if (recorder_ != nullptr) start_ = absl::Now();
  }
  ~TraceSpan() {
    if (recorder_ != nullptr)
      recorder_->Add(track_, std::move(name_), start_, absl::Now() - start_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  TraceRecorder* recorder_;
  int track_;
  std::string name_;
  absl::Time start_;
};

}  // namespace strata

#endif  // STRATA_COMMON_BASE_TRACE_H_
