#include "common/base/trace.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// A JSON string literal (names are ours, but quotes and control bytes must not break it).
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrCat("\\u00", c < 0x10 ? "0" : "", absl::Hex(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

TraceRecorder::TraceRecorder(std::string process_name, size_t max_events)
    : process_name_(std::move(process_name)), max_events_(max_events) {}

void TraceRecorder::NameTrack(int track, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  tracks_[track] = std::move(name);
}

void TraceRecorder::Add(int track, std::string name, absl::Time start, absl::Duration duration) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(
      {track, std::move(name), absl::ToUnixMicros(start), absl::ToInt64Microseconds(duration)});
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

uint64_t TraceRecorder::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

std::string TraceRecorder::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  const int pid = static_cast<int>(getpid());
  std::string out = "{\"traceEvents\":[\n";
  out += absl::StrCat(R"({"ph":"M","name":"process_name","pid":)", pid,
                      R"(,"tid":0,"args":{"name":)", Quoted(process_name_), "}}");
  for (const auto& [track, name] : tracks_) {
    out += absl::StrCat(",\n", R"({"ph":"M","name":"thread_name","pid":)", pid, R"(,"tid":)", track,
                        R"(,"args":{"name":)", Quoted(name), "}}");
  }
  for (const Event& e : events_) {
    out += absl::StrCat(",\n", R"({"ph":"X","pid":)", pid, R"(,"tid":)", e.track, R"(,"name":)",
                        Quoted(e.name), R"(,"ts":)", e.start_us, R"(,"dur":)", e.duration_us, "}");
  }
  out += absl::StrCat("\n],\"otherData\":{\"dropped_events\":", dropped_, "}}\n");
  return out;
}

absl::Status TraceRecorder::Write(const std::string& path) const {
  std::ofstream file(path, std::ios::trunc);
  if (!file) return absl::UnavailableError(absl::StrCat("cannot write the trace to ", path));
  file << ToJson();
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat("writing the trace to ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace strata
