#include "common/base/trace_flags.h"

#include <algorithm>

#include "absl/flags/flag.h"
#include "common/base/logging.h"

ABSL_FLAG(std::string, trace_file, "",
          "Write a timeline of this node's work (Chrome trace JSON) here at shutdown; empty: "
          "no timeline");
ABSL_FLAG(int64_t, trace_events, 20000, "Events the timeline keeps (the first ones)");

namespace strata {

std::unique_ptr<TraceRecorder> TraceRecorderFromFlags(const std::string& process_name) {
  if (absl::GetFlag(FLAGS_trace_file).empty()) return nullptr;
  return std::make_unique<TraceRecorder>(
      process_name, static_cast<size_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_trace_events))));
}

void WriteTraceFromFlags(const TraceRecorder* trace) {
  if (trace == nullptr) return;
  const std::string path = absl::GetFlag(FLAGS_trace_file);
  if (absl::Status s = trace->Write(path); !s.ok()) {
    LOG(ERROR) << s.message();
    return;
  }
  LOG(INFO) << "wrote " << trace->size() << " timeline events to " << path << " ("
            << trace->dropped() << " dropped)";
}

}  // namespace strata
