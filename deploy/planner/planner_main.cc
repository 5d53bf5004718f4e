// The planner command: what a deployment's decode loop would do under each pipelining mode,
// from measured costs (pipeline_model.h). Costs usually come from a flag file written by
// tests/bench/planner_calibrate.py on the hardware in question:
//
//   bazel-bin/deploy/planner/strata_planner --flagfile=costs.flags --modes=off,two,fixed \
//       --rows=8,64 --contexts=256,2048 --batches=2 --memory_nodes=1 --compute_devices=1
//
// For every mode, rows and context it prints tokens/s, the time per output token, and the
// idle fraction of the compute devices and of the memory nodes; with --advise, also the
// fewest memory nodes that reach 95% of the throughput of --max_memory_nodes.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "deploy/planner/pipeline_model.h"

ABSL_FLAG(int, layers, 0, "Model layers");
ABSL_FLAG(std::string, compute_us, "",
          "GEMM time of one decode step on one compute device by rows, us: rows:us,...");
ABSL_FLAG(double, attention_fixed_us, 0.0, "Attention of one step, all layers: fixed part, us");
ABSL_FLAG(double, attention_per_row_us, 0.0, "... per row, us");
ABSL_FLAG(double, attention_per_position_us, 0.0, "... per row and context position, us");
ABSL_FLAG(double, link_latency_us, 0.0, "One-way link latency, us");
ABSL_FLAG(double, link_gbytes_per_s, 10.0, "Link bandwidth, GB/s");
ABSL_FLAG(double, bytes_out_per_row, 0.0, "Bytes per row and layer to memory (q, k, v)");
ABSL_FLAG(double, bytes_back_per_row, 0.0, "Bytes per row and layer back (attention output)");
ABSL_FLAG(double, context_bytes_per_row, 0.0, "Bytes per row of a migrating batch context");
ABSL_FLAG(double, step_gap_us, 0.0,
          "Synchronous scheduling: from a step's end to the batch's next plan at the node, us");
ABSL_FLAG(double, serving_fixed_us, 0.0,
          "CPU of the scheduler, API and node service threads per step on the compute device, "
          "where they share its cores (0: cores of their own): fixed part, us");
ABSL_FLAG(double, serving_per_row_us, 0.0, "... per row, us");

ABSL_FLAG(std::string, modes, "off,two,fixed,rotational", "Modes to model");
ABSL_FLAG(std::string, rows, "8,64", "Rows per batch");
ABSL_FLAG(std::string, contexts, "256,2048", "Context per sequence");
ABSL_FLAG(int, batches, 0,
          "Batches: off 1 per replica; two 2 per replica; fixed R; rotational n (0: off 1, "
          "two 2, fixed 2, rotational 3)");
ABSL_FLAG(int, compute_devices, 1, "Compute devices (replicas share them round-robin)");
ABSL_FLAG(int, memory_nodes, 1, "Memory nodes");
ABSL_FLAG(bool, asynchronous, false, "Mode off with asynchronous scheduling (no step gap)");
ABSL_FLAG(bool, advise, false, "Also search for the fewest memory nodes worth having");
ABSL_FLAG(int, max_memory_nodes, 32, "Upper end of the --advise search");
ABSL_FLAG(int, steps, 64, "Steps simulated per batch (the second half is measured)");
ABSL_FLAG(bool, csv, false, "One comma-separated line per prediction");

namespace strata::planner {
namespace {

std::vector<int> Ints(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int v;
    if (!absl::SimpleAtoi(item, &v)) {
      std::fprintf(stderr, "strata_planner: not an integer: '%s'\n", std::string(item).c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

int DefaultBatches(Mode mode) {
  switch (mode) {
    case Mode::kOff:
      return 1;
    case Mode::kTwo:
    case Mode::kFixed:
      return 2;
    case Mode::kRotational:
      return 3;
  }
  return 1;
}

int Run() {
  Costs costs;
  costs.layers = absl::GetFlag(FLAGS_layers);
  auto curve = Curve::Parse(absl::GetFlag(FLAGS_compute_us));
  if (!curve.ok() || costs.layers < 1) {
    std::fprintf(stderr,
                 "strata_planner: give --layers and --compute_us (or --flagfile from "
                 "tests/bench/planner_calibrate.py)%s%s\n",
                 curve.ok() ? "" : ": --compute_us: ",
                 curve.ok() ? "" : std::string(curve.status().message()).c_str());
    return 2;
  }
  costs.compute_us = *curve;
  costs.attention_fixed_us = absl::GetFlag(FLAGS_attention_fixed_us);
  costs.attention_per_row_us = absl::GetFlag(FLAGS_attention_per_row_us);
  costs.attention_per_position_us = absl::GetFlag(FLAGS_attention_per_position_us);
  costs.link_latency_us = absl::GetFlag(FLAGS_link_latency_us);
  costs.link_bytes_per_us = absl::GetFlag(FLAGS_link_gbytes_per_s) * 1e3;
  costs.bytes_out_per_row = absl::GetFlag(FLAGS_bytes_out_per_row);
  costs.bytes_back_per_row = absl::GetFlag(FLAGS_bytes_back_per_row);
  costs.context_bytes_per_row = absl::GetFlag(FLAGS_context_bytes_per_row);
  costs.step_gap_us = absl::GetFlag(FLAGS_step_gap_us);
  costs.serving_fixed_us = absl::GetFlag(FLAGS_serving_fixed_us);
  costs.serving_per_row_us = absl::GetFlag(FLAGS_serving_per_row_us);
  const bool csv = absl::GetFlag(FLAGS_csv);
  const bool advise = absl::GetFlag(FLAGS_advise);
  if (csv) {
    std::printf(
        "mode,rows,context,batches,replicas,compute_devices,memory_nodes,tokens_per_s,tpot_ms,"
        "compute_bubble,memory_bubble%s\n",
        advise ? ",advised_memory_nodes" : "");
  } else {
    std::printf("%-10s %5s %7s %7s %8s %7s %6s %11s %9s %9s %9s%s\n", "mode", "rows", "context",
                "batches", "replicas", "devices", "memory", "tokens/s", "tpot_ms", "cmp_idle",
                "mem_idle", advise ? "  advised_memory" : "");
  }
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',')) {
    auto mode = ParseMode(name);
    if (!mode.ok()) {
      std::fprintf(stderr, "strata_planner: %s\n", std::string(mode.status().message()).c_str());
      return 2;
    }
    for (int rows : Ints(absl::GetFlag(FLAGS_rows))) {
      for (int context : Ints(absl::GetFlag(FLAGS_contexts))) {
        Scenario setup;
        setup.mode = *mode;
        setup.rows = rows;
        setup.context = context;
        setup.batches =
            absl::GetFlag(FLAGS_batches) > 0 ? absl::GetFlag(FLAGS_batches) : DefaultBatches(*mode);
        setup.compute_devices = absl::GetFlag(FLAGS_compute_devices);
        setup.memory_nodes = absl::GetFlag(FLAGS_memory_nodes);
        setup.asynchronous = absl::GetFlag(FLAGS_asynchronous) && *mode == Mode::kOff;
        auto p = Simulate(costs, setup, absl::GetFlag(FLAGS_steps));
        if (!p.ok()) {
          std::fprintf(stderr, "strata_planner: %s: %s\n", std::string(name).c_str(),
                       std::string(p.status().message()).c_str());
          return 2;
        }
        int advised = 0;
        if (advise) {
          // The fewest memory nodes within 5% of the most throughput on offer.
          std::vector<double> tps;
          for (int m = 1; m <= absl::GetFlag(FLAGS_max_memory_nodes); ++m) {
            Scenario trial = setup;
            trial.memory_nodes = m;
            auto q = Simulate(costs, trial, absl::GetFlag(FLAGS_steps));
            tps.push_back(q.ok() ? q->tokens_per_s : 0.0);
          }
          const double best = *std::max_element(tps.begin(), tps.end());
          for (size_t m = 0; m < tps.size() && advised == 0; ++m) {
            if (tps[m] >= 0.95 * best) advised = static_cast<int>(m) + 1;
          }
        }
        if (csv) {
          std::printf("%s,%d,%d,%d,%d,%d,%d,%.2f,%.3f,%.3f,%.3f", std::string(name).c_str(), rows,
                      context, setup.batches, Replicas(setup), setup.compute_devices,
                      setup.memory_nodes, p->tokens_per_s, p->step_ms, p->compute_bubble,
                      p->memory_bubble);
          if (advise) std::printf(",%d", advised);
          std::printf("\n");
        } else {
          std::printf("%-10s %5d %7d %7d %8d %7d %6d %11.1f %9.2f %9.2f %9.2f",
                      std::string(name).c_str(), rows, context, setup.batches, Replicas(setup),
                      setup.compute_devices, setup.memory_nodes, p->tokens_per_s, p->step_ms,
                      p->compute_bubble, p->memory_bubble);
          if (advise) std::printf("  %15d", advised);
          std::printf("\n");
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata::planner

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Models a deployment's decode loop under each pipelining mode from measured costs");
  absl::ParseCommandLine(argc, argv);
  return strata::planner::Run();
}
