// The --trace_file and --trace_events flags of the node binaries (compute_node,
// memory_node): a timeline of their work as Chrome trace JSON (trace.h), written when the
// node shuts down.
#ifndef STRATA_COMMON_BASE_TRACE_FLAGS_H_
#define STRATA_COMMON_BASE_TRACE_FLAGS_H_

#include <memory>
#include <string>

#include "common/base/trace.h"

namespace strata {

// A recorder when --trace_file is set, else null (nothing is recorded).
std::unique_ptr<TraceRecorder> TraceRecorderFromFlags(const std::string& process_name);

// Writes `trace` (if any) to --trace_file, logging the outcome.
void WriteTraceFromFlags(const TraceRecorder* trace);

}  // namespace strata

#endif  // STRATA_COMMON_BASE_TRACE_FLAGS_H_
