#!/usr/bin/python3
"""Fixed staggered pipelining against the same deployment without the stagger (issue "Fixed
and rotational staggered pipelining"): two compute nodes sharing the compute cores and one
memory node on the others, --pipelining=fixed against off, interleaved rounds, medians of
decode throughput (pipeline_bench.py's workload and measurement).

On a machine whose compute nodes must share cores, this measures the stagger's cost, not
its gain: fixed pipelining is for replicas on devices of their own.

  /usr/bin/python3 tests/bench/fixed_bench.py --bin_dir="$(bazel info bazel-bin)" \
      [--rounds=2] [--rows=8] [--contexts=2048] [--tokens=24]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pipeline_bench  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", default="8")
    parser.add_argument("--contexts", default="2048")
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two cores to partition")
    part = [f"--compute_cpus={cpus[0]}", f"--memory_cpus={cpus[1]}", "--memory_nodes=1",
            "--data_plane=sm", "--memory_kv_budget_mib=1024", "--compute_nodes=2"]
    modes = {"off": part, "fixed": part + ["--pipelining=fixed"]}
    grid = [(int(r), int(c)) for r in args.rows.split(",") for c in args.contexts.split(",")]
    results = {m: {p: [] for p in grid} for m in modes}
    names = list(modes)
    for r in range(args.rounds):
        for m in names[r % 2:] + names[:r % 2]:
            got = pipeline_bench.run_mode(args.bin_dir, modes[m], grid, args.tokens, 7 + r)
            for p, f in got.items():
                results[m][p].append(f["tok/s"])
            print(f"round {r + 1}: {m} done", file=sys.stderr, flush=True)
    print(f"2 compute nodes on cpu {cpus[0]}, 1 memory node on cpu {cpus[1]}; "
          f"{args.rounds} interleaved rounds, medians")
    for p in grid:
        off = statistics.median(results["off"][p])
        fixed = statistics.median(results["fixed"][p])
        print(f"rows {p[0]} ctx {p[1]}: off {off:.1f} tok/s, fixed {fixed:.1f} tok/s, "
              f"fixed/off {fixed / off:.2f}")


if __name__ == "__main__":
    main()
