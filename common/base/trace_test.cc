// The trace file is JSON that Chrome's trace viewer reads: checked by parsing it back.
#include "common/base/trace.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

TEST(TraceTest, WritesCompleteEventsOnNamedTracks) {
  TraceRecorder trace("compute-0", 2);
  trace.NameTrack(1, "lane \"1\"");
  const absl::Time t0 = absl::FromUnixMicros(1'000'000);
  trace.Add(1, "step 7 L0", t0, absl::Microseconds(250));
  trace.Add(0, "wait\n", t0 + absl::Microseconds(250), absl::Microseconds(40));
  trace.Add(0, "dropped", t0, absl::Microseconds(1));  // over the cap
  EXPECT_EQ(trace.size(), 2u);
  EXPECT_EQ(trace.dropped(), 1u);
  const nlohmann::json json = nlohmann::json::parse(trace.ToJson());
  const auto& events = json["traceEvents"];
  ASSERT_EQ(events.size(), 4u);  // process name, one track name, two events
  EXPECT_EQ(events[0]["args"]["name"], "compute-0");
  EXPECT_EQ(events[1]["args"]["name"], "lane \"1\"");
  EXPECT_EQ(events[1]["tid"], 1);
  EXPECT_EQ(events[2]["ph"], "X");
  EXPECT_EQ(events[2]["name"], "step 7 L0");
  EXPECT_EQ(events[2]["ts"], 1'000'000);
  EXPECT_EQ(events[2]["dur"], 250);
  EXPECT_EQ(events[3]["name"], "wait\n");
  EXPECT_EQ(events[3]["ts"], 1'000'250);
  EXPECT_EQ(json["otherData"]["dropped_events"], 1);
}

TEST(TraceTest, WriteFailsClearlyOnABadPath) {
  TraceRecorder trace("x", 1);
  const absl::Status s = trace.Write("/nonexistent-dir/trace.json");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("/nonexistent-dir/trace.json"), std::string::npos);
}

}  // namespace
}  // namespace strata
