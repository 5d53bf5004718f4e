#include "deploy/planner/pipeline_model.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace strata::planner {

Curve::Curve(std::vector<std::pair<double, double>> points) : points_(std::move(points)) {}

absl::StatusOr<Curve> Curve::Parse(absl::string_view text) {
  std::vector<std::pair<double, double>> points;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> xy = absl::StrSplit(item, ':');
    double x, y;
    if (!absl::SimpleAtod(xy.first, &x) || !absl::SimpleAtod(xy.second, &y)) {
      return absl::InvalidArgumentError(absl::StrCat("not x:y: '", item, "'"));
    }
    if (!points.empty() && x <= points.back().first) {
      return absl::InvalidArgumentError(absl::StrCat("x must increase: '", text, "'"));
    }
    points.emplace_back(x, y);
  }
  if (points.empty()) return absl::InvalidArgumentError("no points");
  return Curve(std::move(points));
}

double Curve::At(double x) const {
  if (points_.size() == 1) return points_[0].second;
  // The segment holding x, or the first or last one extended.
  size_t i = 1;
  while (i + 1 < points_.size() && x > points_[i].first) ++i;
  const auto [x0, y0] = points_[i - 1];
  const auto [x1, y1] = points_[i];
  return std::max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0));
}

namespace {
constexpr std::pair<Mode, absl::string_view> kModes[] = {{Mode::kOff, "off"},
                                                         {Mode::kTwo, "two"},
                                                         {Mode::kFixed, "fixed"},
                                                         {Mode::kRotational, "rotational"}};
}  // namespace

absl::StatusOr<Mode> ParseMode(absl::string_view name) {
  for (const auto& [mode, text] : kModes) {
    if (name == text) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode '", name, "' (off, two, fixed or rotational)"));
}

std::string ModeName(Mode mode) {
  for (const auto& [m, text] : kModes) {
    if (m == mode) return std::string(text);
  }
  return "?";
}

int Replicas(const Scenario& s) {
  switch (s.mode) {
    case Mode::kOff:
    case Mode::kFixed:
      return s.batches;
    case Mode::kTwo:
      return (s.batches + 1) / 2;
    case Mode::kRotational:
      return s.batches - 1;
  }
  return 0;
}

absl::Status Validate(const Scenario& s) {
  if (s.rows < 1 || s.context < 1 || s.batches < 1 || s.compute_devices < 1 || s.memory_nodes < 1) {
    return absl::InvalidArgumentError(
        "rows, context, batches, compute devices and memory nodes must be positive");
  }
  if (s.mode == Mode::kRotational && s.batches < 2) {
    return absl::InvalidArgumentError("rotational pipelining needs at least 2 batches");
  }
  if (s.asynchronous && s.mode != Mode::kOff) {
    return absl::InvalidArgumentError("asynchronous scheduling is modelled with mode off only");
  }
  return absl::OkStatus();
}

namespace {

// Busy time of one server inside a window, from its busy intervals.
struct Server {
  double free_at = 0.0;
  std::vector<std::pair<double, double>> busy;
  double Take(double ready, double duration) {
    const double start = std::max(ready, free_at);
    free_at = start + duration;
    if (duration > 0) busy.emplace_back(start, free_at);
    return start;
  }
  double BusyIn(double from, double to) const {
    double total = 0.0;
    for (const auto& [a, b] : busy) total += std::max(0.0, std::min(b, to) - std::max(a, from));
    return total;
  }
};

struct Batch {
  int step = 0;
  int slice = 0;           // the next slice to run (0..L)
  bool attention = false;  // the next piece is slice-1's attention, not a slice
  double slice_end = 0.0;  // when the slice before the pending attention ended
  int last_replica = 0;
  double step_start = 0.0;
  std::vector<double> step_ends;
};

}  // namespace

absl::StatusOr<Prediction> Simulate(const Costs& c, const Scenario& s, int steps) {
  if (absl::Status st = Validate(s); !st.ok()) return st;
  if (c.layers < 1 || c.compute_us.empty() || c.link_bytes_per_us <= 0.0) {
    return absl::InvalidArgumentError("costs need layers, a compute curve and a link bandwidth");
  }
  if (steps < 4) return absl::InvalidArgumentError("simulate at least 4 steps");
  const int L = c.layers;
  const int replicas = Replicas(s);
  const double slice_us = c.compute_us.At(s.rows) / (L + 1);
  const double node_rows = static_cast<double>(s.rows) / s.memory_nodes;
  const double attention_us = (c.attention_fixed_us + c.attention_per_row_us * node_rows +
                               c.attention_per_position_us * node_rows * s.context) /
                              L;
  const double out_us = c.link_latency_us + node_rows * c.bytes_out_per_row / c.link_bytes_per_us;
  const double back_us = c.link_latency_us + node_rows * c.bytes_back_per_row / c.link_bytes_per_us;
  const double migrate_us =
      c.link_latency_us + s.rows * c.context_bytes_per_row / c.link_bytes_per_us;
  const double gap_us = s.asynchronous ? 0.0 : c.step_gap_us;
  const double serving_us = c.serving_fixed_us + c.serving_per_row_us * s.rows;

  std::vector<Server> devices(s.compute_devices), memory(s.memory_nodes);
  std::vector<Batch> batches(s.batches);
  const auto replica_of = [&](int batch, const Batch& b) {
    switch (s.mode) {
      case Mode::kOff:
      case Mode::kFixed:
        return batch;
      case Mode::kTwo:
        return batch / 2;
      case Mode::kRotational:
        return static_cast<int>((batch + static_cast<int64_t>(b.step) * (L + 1) + b.slice) %
                                replicas);
    }
    return 0;
  };
  // Fixed pipelining's stagger: the smoothed step period over the replicas, as the
  // scheduler keeps it (server/step_clock.h).
  double last_start = -1e300, period = 0.0;
  bool have_period = false;

  using Event = std::tuple<double, int>;  // ready time, batch
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> ready;
  for (int j = 0; j < s.batches; ++j) ready.emplace(0.0, j);
  while (!ready.empty()) {
    auto [t, j] = ready.top();
    ready.pop();
    Batch& b = batches[j];
    if (b.attention) {
      double done = 0.0;
      for (Server& node : memory) {
        const double start = node.Take(t, attention_us);
        done = std::max(done, start + attention_us + back_us);
      }
      b.attention = false;
      double next = done;
      const int next_replica = replica_of(j, b);
      if (next_replica != b.last_replica) next = std::max(next, b.slice_end + migrate_us);
      ready.emplace(next, j);
      continue;
    }
    if (b.slice == 0 && s.mode == Mode::kFixed && have_period && replicas > 1) {
      const double allowed = last_start + period / replicas;
      if (t < allowed) {
        ready.emplace(allowed, j);
        continue;
      }
    }
    const int replica = replica_of(j, b);
    Server& device = devices[replica % s.compute_devices];
    const double start = device.Take(t, slice_us);
    const double end = start + slice_us;
    if (b.slice == 0) {
      b.step_start = start;
      last_start = start;
    }
    b.last_replica = replica;
    if (b.slice < L) {
      b.slice_end = end;
      b.attention = true;
      ++b.slice;
      ready.emplace(end + out_us, j);
      continue;
    }
    // The step is done; serving it (its result, the next plan) takes the device next.
    device.Take(end, serving_us);
    const double wall = end - b.step_start;
    period = have_period ? 0.8 * period + 0.2 * wall : wall;
    have_period = true;
    b.step_ends.push_back(end);
    b.slice = 0;
    ++b.step;
    if (b.step < steps) ready.emplace(end + gap_us, j);
  }

  // The steady state: from when every batch has done half its steps to when the first
  // batch is done.
  const int half = steps / 2;
  double from = 0.0, to = 1e300;
  for (const Batch& b : batches) {
    from = std::max(from, b.step_ends[half - 1]);
    to = std::min(to, b.step_ends.back());
  }
  Prediction p;
  double tokens = 0.0, periods = 0.0;
  for (const Batch& b : batches) {
    for (double e : b.step_ends) tokens += e > from && e <= to ? s.rows : 0;
    periods += (b.step_ends.back() - b.step_ends[half - 1]) / (steps - half);
  }
  const double window = to - from;
  if (window <= 0.0) return absl::InternalError("no steady-state window");
  p.tokens_per_s = tokens / window * 1e6;
  p.step_ms = periods / s.batches / 1e3;
  double busy = 0.0;
  for (const Server& d : devices) busy += d.BusyIn(from, to);
  p.compute_bubble = std::max(0.0, 1.0 - busy / (window * s.compute_devices));
  busy = 0.0;
  for (const Server& m : memory) busy += m.BusyIn(from, to);
  p.memory_bubble = std::max(0.0, 1.0 - busy / (window * s.memory_nodes));
  return p;
}

}  // namespace strata::planner
