#!/usr/bin/python3
"""One build, several sets of launcher flags, interleaved in one run: for a flag whose effect
on served decode is the question. Each round starts the embedded default once per variant
(alternating the order), and measures single-stream decode (tokens/s from the first to the
last streamed token of a 128-token greedy completion, median of 3) and, with --clients,
the throughput of that many concurrent streams (median of 2). Figures are medians over
rounds, with each variant's ratio to the first.

  /usr/bin/python3 tests/bench/launcher_flags_ab.py --bin_dir="$(bazel info bazel-bin)" \\
      --rounds=6 [--memory_nodes=0] [--clients=16] \\
      --variant="off=--server_args=--service_threads_yield=false \\
          --node_args=--service_threads_yield=false" --variant="on="
"""
import argparse
import os
import shlex
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402
import peer_bench  # noqa: E402


def measure(bin_dir, memory_nodes, args, clients):
    out = {}
    with compare_builds.launch(bin_dir, memory_nodes, args) as (port, model, _):
        out["1 client tok/s"] = compare_builds.single_stream_rate(port, model, 3)
        if clients > 1:
            peer_bench.throughput(port, model, 4, 16)  # warm-up
            out[f"{clients} clients tok/s"] = statistics.median(
                peer_bench.throughput(port, model, clients) for _ in range(2))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--memory_nodes", type=int, default=0)
    parser.add_argument("--clients", type=int, default=0,
                        help="also measure this many concurrent streams (0: only one)")
    parser.add_argument("--variant", action="append", required=True,
                        help="NAME=launcher flags (shell words); the first is the baseline")
    args = parser.parse_args()
    variants = {}
    for v in args.variant:
        name, _, flags = v.partition("=")
        variants[name] = shlex.split(flags)
    names = list(variants)
    figures = {name: {} for name in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            got = measure(args.bin_dir, args.memory_nodes, variants[name], args.clients)
            for key, value in got.items():
                figures[name].setdefault(key, []).append(value)
            print(f"round {r + 1} {name}: " +
                  ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    keys = list(figures[names[0]])
    print(f"medians of {args.rounds} interleaved rounds, memory nodes {args.memory_nodes}")
    print(f"{'figure':24s}" + "".join(f"{n:>12s}" for n in names) +
          "".join(f"{n + '/' + names[0]:>16s}" for n in names[1:]))
    for key in keys:
        med = [statistics.median(figures[n][key]) for n in names]
        print(f"{key:24s}" + "".join(f"{m:12.2f}" for m in med) +
              "".join(f"{m / med[0]:16.3f}" for m in med[1:]))


if __name__ == "__main__":
    main()
