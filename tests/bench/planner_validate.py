#!/usr/bin/python3
"""The planner (deploy/planner, issue "Fixed and rotational staggered pipelining") against
this machine: calibrate it, then predict end-to-end runs that were not used for
calibration and print prediction against measurement.

Calibration (micro-benchmarks, and served runs at shapes the validation does not use;
written to a flag file for strata_planner, except serving, which differs by mode and goes
on each prediction's command line):
  - compute: decode_bench's GEMM-only step (every slice, LM head, sampling; no attention) on
    one core with one thread, as the compute node runs in the partition below;
  - attention: the memory node's own time handling layer frames (KV writes, attention,
    framing: strata_memory_node_attention_seconds) per step while one batch decodes with
    asynchronous scheduling in the validation partition, at rows 4 and 16 and contexts
    512 and 1280 (all of it fits the 1 GiB KV pool), median of 2 runs, fitted by least
    squares to fixed + per_row * rows + per_position * rows * context. With
    --attention_from=kernel, attention_bench's kernel alone on the memory node's core with
    one thread (slots scattered in blocks) instead, which left out the node's work beside
    the kernel (about 20% at context 1024); until 2026-11-26 that was the only way, and
    before it decode_bench's full step minus its GEMM-only step, which made attention 2.4x
    slower than the memory node runs it.
  - link: transport_bench over UCX shared memory (the partition's data plane): half the
    round trip of a 64-byte message, and the streaming bandwidth at 300 kB;
  - step gap (the scheduler's round trip between a batch's result and its next plan, which
    synchronous modes pay every step): the compute node's own mean wait for its next plan
    (strata_compute_node_plan_wait_seconds) while one row decodes at context 64 with
    synchronous scheduling in the validation partition, median of 2 runs. One row at
    context 64 is a shape the validation does not run.
  - serving (the scheduler's, the API's and the compute nodes' service threads' CPU per
    step of a batch, which the validation partition puts on the compute core), for each
    mode under its own flags (two compute nodes, and contexts migrating between them,
    cost more than one): their threads' CPU time (/proc, pipeline_bench's
    serving_cpu_ms) while 6 and then 24 rows in all decode at context 64, as many tokens
    as the validation streams (until 2026-11-26 16:00, 48 whatever --tokens said), median
    of 2 runs, fitted as fixed + per_row * rows per batch. (Until 2026-11-26 the model had no
    such cost, and predicted every mode faster than measured by 14-49%.)
The calibration shapes (GEMMs at batches 1, 4, 12, 24, 48; the kernel at those batches and
contexts 512, 1536, 3072; the memory node at rows 4 and 16 and contexts 512 and 1280;
serving at 6 and 24 rows, context 64) differ from the validation shapes.

Validation (end to end, the launcher as tests/bench/pipeline_bench.py runs it: compute node
and scheduler on one core, one memory node on the other, UCX shared memory), interleaved
rounds, medians:
  off     one batch, asynchronous scheduling     model: off, asynchronous, 1 batch of B rows
  two     --pipelining=two                       model: two, 2 batches of B/2 rows
  fixed   --pipelining=fixed, 2 compute nodes    model: fixed, 2 batches of B/2 rows, both
          sharing the compute core                      replicas on 1 device
  rotational  --pipelining=rotational, 2 compute nodes, 3 batches
                                                 model: rotational, 3 batches of B/3 rows,
                                                        both replicas on 1 device
(rows B must divide by the batches of every mode chosen).

  /usr/bin/python3 tests/bench/planner_validate.py --bin_dir="$(bazel info bazel-bin)" \
      [--rounds=4] [--calibration_rounds=4] [--rows=8,16,64] [--contexts=256,2048] \
      [--modes=off,two,fixed,rotational] \
      [--costs_out=FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pipeline_bench  # noqa: E402

CAL_BATCHES = "1,4,12,24,48"
CAL_CONTEXTS = "512,1536,3072"


def calibrate(bin_dir, model, compute_cpu, memory_cpu):
    env = dict(os.environ, OMP_NUM_THREADS="1", GOMP_SPINCOUNT="10000")
    out = subprocess.run(
        ["taskset", "-c", str(compute_cpu), f"{bin_dir}/compute_node/bench/decode_bench",
         f"--model={model}", f"--batches={CAL_BATCHES}",
         # Its GEMM-only step does not depend on the context: the shortest will do.
         f"--contexts={CAL_CONTEXTS.split(',')[0]}", "--rounds=2", "--iters=4"], env=env, capture_output=True, text=True, check=True,
        cwd="/tmp").stdout
    gemm = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 11 and f[0].isdigit():
            gemm.setdefault(int(f[0]), []).append(float(f[5]) * 1e3)
    if not gemm:
        raise RuntimeError("decode_bench printed no figures:\n" + out)
    config = json.load(open(os.path.join(model, "config.json")))
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", hidden // heads)
    layers = config["num_hidden_layers"]
    out = subprocess.run(
        ["taskset", "-c", str(memory_cpu), f"{bin_dir}/kernels/cpu/bench/attention_bench",
         f"--batches={CAL_BATCHES}", f"--contexts={CAL_CONTEXTS}", f"--heads={heads}",
         f"--kv_heads={kv_heads}", f"--head_dim={head_dim}", "--seconds=0.5", "--probe=false"],
        env=env, capture_output=True, text=True, check=True, cwd="/tmp").stdout
    attention = []
    columns = None
    for line in out.splitlines():
        f = line.split()
        if f[:1] == ["isa"]:
            columns = {name: i for i, name in enumerate(f)}
        elif columns and len(f) == len(columns) and f[columns["batch"]].isdigit():
            attention.append((int(f[columns["batch"]]), int(f[columns["ctx"]]),
                              float(f[columns["layer_us"]]) * layers))
    if not attention:
        raise RuntimeError("attention_bench printed no figures:\n" + out)
    compute_us = ",".join(f"{b}:{statistics.median(v):.1f}" for b, v in sorted(gemm.items()))
    coef, worst = fit_attention(attention)
    out = subprocess.run(
        ["taskset", "-c", f"{compute_cpu},{memory_cpu}",
         f"{bin_dir}/common/transport/bench/transport_bench", "--tls=sm,self",
         "--sizes=64,300000", "--iters=2000"], env=env, capture_output=True, text=True,
        check=True, cwd="/tmp").stdout
    rows = {int(f[0]): f for f in (line.split() for line in out.splitlines())
            if len(f) == 4 and f[0].isdigit()}
    latency_us = float(rows[64][2]) / 2
    gbytes = float(rows[300000][3])
    flags = [
        f"--layers={layers}",
        f"--compute_us={compute_us}",
        *attention_flags(coef),
        f"--link_latency_us={latency_us:.2f}",
        f"--link_gbytes_per_s={gbytes:.2f}",
        f"--bytes_out_per_row={(heads + 2 * kv_heads) * head_dim * 2}",
        f"--bytes_back_per_row={heads * head_dim * 2}",
        f"--context_bytes_per_row={hidden * 4}",
    ]
    return flags, worst


def fit_attention(points):
    """fixed + per_row * rows + per_position * rows * context through (rows, context, us)
    points, by least squares on relative error (each shape weighs the same whatever its
    size); the coefficients and the worst relative error of the fit."""
    a = np.array([[1.0, b, b * c] for b, c, _ in points])
    y = np.array([t for _, _, t in points])
    coef, *_ = np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)
    fitted = a @ coef
    return coef, max(abs(f - t) / t for f, t in zip(fitted, y))


def attention_flags(coef):
    return [f"--attention_fixed_us={coef[0]:.3f}", f"--attention_per_row_us={coef[1]:.4f}",
            f"--attention_per_position_us={coef[2]:.7f}"]


def served_figures(bin_dir, launcher_flags, points, tokens, seed, key, rounds=2):
    """{point: [figure `key` of pipeline_bench.run_point, one per round]}: the deployment
    started `rounds` times with `launcher_flags` (seeds seed, seed + 1, ...), every row
    with a prompt of its own."""
    out = {p: [] for p in points}
    for r in range(rounds):
        got = pipeline_bench.run_mode(bin_dir, launcher_flags, points, tokens, seed + r,
                                      shared_prefix=False)
        for p in points:
            out[p].append(got[p][key])
    return out


def memory_node_attention(bin_dir, compute_cpu, memory_cpu, rounds=2):
    """The attention costs from the memory node as it serves: its time handling layer
    frames per step (KV writes, attention, framing; strata_memory_node_attention_seconds),
    while one batch decodes with asynchronous scheduling in the validation partition, at
    rows 4 and 16 and contexts 512 and 1280; flags and the fit's worst relative error."""
    # Every row's KV (context + 32 tokens) fits the partition's 1 GiB pool at once: a point
    # that overflows it measures preemption, not attention.
    points = [(r, c) for r in (4, 16) for c in (512, 1280)]
    busy = served_figures(bin_dir, pipeline_bench.partition_flags(compute_cpu, memory_cpu) +
                          ["--async_scheduling"], points, 32, 11, "memory_busy_ms", rounds)
    busy = {p: [ms * 1e3 for ms in v] for p, v in busy.items()}
    print("  memory node's busy time per step: " +
          ", ".join(f"{p[0]} rows ctx {p[1]} {', '.join(f'{v:.0f}' for v in busy[p])} us"
                    for p in points), file=sys.stderr)
    coef, worst = fit_attention([(p[0], p[1], statistics.median(busy[p])) for p in points])
    return attention_flags(coef), worst


def step_gap_us(bin_dir, compute_cpu, memory_cpu, rounds=2):
    point = (1, 64)
    waits = served_figures(bin_dir, pipeline_bench.partition_flags(compute_cpu, memory_cpu) +
                           ["--async_scheduling=false"], [point], 48, 3, "plan_wait_ms",
                           rounds)[point]
    print(f"  step gap: compute node's mean wait for its next plan, synchronous, 1 row at "
          f"context 64: {', '.join(f'{w:.3f}' for w in waits)} ms", file=sys.stderr)
    return 1e3 * statistics.median(waits)


def serving_costs(bin_dir, launcher_flags, batches, tokens, rounds=2):
    """Planner flags for serving's CPU on the compute device under one mode (its launcher
    flags, its number of batches), per step of a batch: fixed + per_row * rows per batch."""
    points = [(6, 64), (24, 64)]  # total rows; every mode's batches divide them
    # As many tokens as the validation streams: per-request CPU (admission, finishing) is
    # spread over as many steps.
    cpu = served_figures(bin_dir, launcher_flags, points, tokens, 5, "serving_cpu_ms", rounds)
    # serving_cpu_ms is per token of a row: one step of every batch.
    cpu = {p: [ms * 1e3 / batches for ms in v] for p, v in cpu.items()}
    (r0, _), (r1, _) = ((p[0] / batches, p[1]) for p in points)
    c0, c1 = (statistics.median(cpu[p]) for p in points)
    per_row = max(0.0, (c1 - c0) / (r1 - r0))
    fixed = max(0.0, c0 - per_row * r0)
    print("  serving: CPU per batch step beside the step threads, context 64: " +
          ", ".join(f"{p[0] // batches} rows {', '.join(f'{v:.0f}' for v in cpu[p])} us"
                    for p in points), file=sys.stderr)
    return [f"--serving_fixed_us={fixed:.1f}", f"--serving_per_row_us={per_row:.2f}"]


def modes(compute_cpu, memory_cpu):
    partition = pipeline_bench.partition_flags(compute_cpu, memory_cpu)
    return {
        # name: (launcher flags, planner flags, batches: the rows are split evenly)
        "off": (partition + ["--async_scheduling"], ["--modes=off", "--asynchronous"], 1),
        "two": (partition + ["--pipelining=two"], ["--modes=two"], 2),
        "fixed": (partition + ["--pipelining=fixed", "--compute_nodes=2"], ["--modes=fixed"], 2),
        "rotational": (partition + ["--pipelining=rotational", "--compute_nodes=2"],
                       ["--modes=rotational"], 3),
    }


def predict(bin_dir, costs_file, planner_flags, rows, context):
    out = subprocess.run(
        [f"{bin_dir}/deploy/planner/strata_planner", f"--flagfile={costs_file}", "--csv",
         "--compute_devices=1", "--memory_nodes=1", f"--rows={rows}", f"--contexts={context}",
         *planner_flags], capture_output=True, text=True, check=True).stdout
    header, line = out.strip().splitlines()[:2]
    return dict(zip(header.split(","), line.split(",")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--model", default=os.path.expanduser(
        os.environ.get("STRATA_CACHE_DIR", "~/.cache/strata") + "/models/demo"))
    # One point's measurement moved by up to 40% between launches (docs/benchmarks.md):
    # medians of 4 launches, for the validation and for every served calibration.
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calibration_rounds", type=int, default=4,
                        help="launches whose median each served calibration takes (the "
                        "memory node's attention, the step gap, serving)")
    parser.add_argument("--rows", default="8,16,64")
    parser.add_argument("--contexts", default="256,2048")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--costs_out", default="")
    parser.add_argument("--modes", default="off,two,fixed,rotational")
    parser.add_argument("--attention_from", default="memory_node",
                        choices=["memory_node", "kernel"],
                        help="calibrate attention from the memory node's busy time as it "
                        "serves (default), or from attention_bench's kernel alone")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two cores to partition")
    compute_cpu, memory_cpu = cpus[0], cpus[1]

    flags, worst = calibrate(args.bin_dir, args.model, compute_cpu, memory_cpu)
    if args.attention_from == "memory_node":
        kernel = [f for f in flags if f.startswith("--attention_")]
        served, worst = memory_node_attention(args.bin_dir, compute_cpu, memory_cpu,
                                              args.calibration_rounds)
        flags = [f for f in flags if f not in kernel] + served
        print("  attention from the kernel alone (not used): " + " ".join(kernel),
              file=sys.stderr)
    gap = step_gap_us(args.bin_dir, compute_cpu, memory_cpu, args.calibration_rounds)
    flags.append(f"--step_gap_us={gap:.0f}")
    all_modes = modes(compute_cpu, memory_cpu)
    names = args.modes.split(",")
    for name in names:
        if name not in all_modes:
            raise SystemExit(f"--modes: no mode {name!r}; there are {', '.join(all_modes)}")
    # Serving's CPU depends on the mode's processes (two compute nodes, contexts migrating
    # between them), so each mode is calibrated under its own flags.
    serving = {}
    for name in names:
        launcher_flags, _, batches = all_modes[name]
        serving[name] = serving_costs(args.bin_dir, launcher_flags, batches, args.tokens,
                                      args.calibration_rounds)
    costs_file = args.costs_out or os.path.join(tempfile.mkdtemp(), "costs.flags")
    with open(costs_file, "w") as f:
        f.write("\n".join(flags) + "\n")
    print("calibration:")
    for flag in flags:
        print("  " + flag)
    for name in names:
        print(f"  {name}: " + " ".join(serving[name]))
    print(f"  attention fit: worst relative error {worst:.1%} over the calibration shapes")

    grid = [(int(r), int(c)) for r in args.rows.split(",") for c in args.contexts.split(",")]
    results = {n: {p: [] for p in grid} for n in names}
    for round_index in range(args.rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for name in order:
            # Every row with a prompt of its own: the memory node reads its KV from DRAM,
            # as attention_bench's calibration does.
            got = pipeline_bench.run_mode(args.bin_dir, all_modes[name][0], grid, args.tokens,
                                          7 + round_index, shared_prefix=False)
            for point, figures in got.items():
                results[name][point].append(figures)
            print(f"round {round_index + 1}: {name} done", file=sys.stderr, flush=True)

    print(f"\nend to end: compute node and scheduler on cpu {compute_cpu}, memory node on cpu "
          f"{memory_cpu}; {args.rounds} interleaved rounds, medians")
    print(f"{'mode':>10} {'rows':>5} {'ctx':>5} | {'measured':>9} {'predicted':>9} {'error':>7} | "
          f"{'tpot meas':>9} {'tpot pred':>9} | {'pred bubble c/m':>15}")
    errors = []
    for name in names:
        for rows, context in grid:
            measured = statistics.median(r["tok/s"] for r in results[name][(rows, context)])
            tpot = statistics.median(r["tpot_ms"] for r in results[name][(rows, context)])
            _, planner_flags, batches = all_modes[name]
            p = predict(args.bin_dir, costs_file,
                        planner_flags + [f"--batches={batches}"] + serving[name],
                        rows // batches, context)
            predicted = float(p["tokens_per_s"])
            error = predicted / measured - 1
            errors.append(abs(error))
            print(f"{name:>10} {rows:>5} {context:>5} | {measured:>9.1f} {predicted:>9.1f} "
                  f"{error:>+7.1%} | {tpot:>9.1f} {float(p['tpot_ms']):>9.1f} | "
                  f"{float(p['compute_bubble']):>7.2f}/{float(p['memory_bubble']):.2f}")
    within = sum(1 for e in errors if e <= 0.15)
    print(f"\n{within} of {len(errors)} predictions within 15% of the measurement; median "
          f"|error| {statistics.median(errors):.1%}, worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
