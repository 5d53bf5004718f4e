#!/usr/bin/python3
"""How long node processes' OpenMP threads should spin before they sleep: served
single-stream decode (the embedded default, demo model, 128 tokens, greedy) with each
GOMP_SPINCOUNT the launcher can set (--omp_spin_count), co-located and with 2 memory nodes,
in interleaved rounds; medians, and each figure over the spin count the launcher uses by
default. 0 is OMP_WAIT_POLICY=PASSIVE (park at once); 30000000000 is what libgomp uses for
OMP_WAIT_POLICY=ACTIVE (spin without bound).

  /usr/bin/python3 tests/bench/wait_policy_bench.py --bin_dir="$(bazel info bazel-bin)" \\
      [--spins=0,1000,10000,100000,300000,30000000000] [--memory_nodes=0,2] [--rounds=3]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402

DEFAULT_SPIN = 10000  # kSharedCoreSpinCount, common/base/wait_policy.h


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--spins", default="0,1000,10000,100000,300000,30000000000")
    parser.add_argument("--memory_nodes", default="0,2")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spins = [int(s) for s in args.spins.split(",")]
    layouts = [int(m) for m in args.memory_nodes.split(",")]
    # The launcher sets OMP_NUM_THREADS and GOMP_SPINCOUNT itself.
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    rates = {}
    for r in range(args.rounds):
        order = spins if r % 2 == 0 else list(reversed(spins))
        for m in layouts:
            for spin in order:
                result = compare_builds.run_serve(
                    args.bin_dir, memory_nodes=m, extra_args=[f"--omp_spin_count={spin}"],
                    env=env, rounds=3)
                rate = next(iter(result.values()))
                rates.setdefault((m, spin), []).append(rate)
                print(f"round {r + 1} memory_nodes={m} spin={spin}: {rate:.2f} tok/s",
                      file=sys.stderr, flush=True)
    print(f"served single-stream decode tok/s, medians of {args.rounds} interleaved rounds")
    print(f"{'memory_nodes':>12} {'spin':>12} {'tok/s':>8} {'vs_default':>10}")
    for m in layouts:
        base = statistics.median(rates[(m, DEFAULT_SPIN)]) if (m, DEFAULT_SPIN) in rates else None
        for spin in spins:
            med = statistics.median(rates[(m, spin)])
            ratio = f"{med / base:.3f}" if base else "-"
            print(f"{m:>12} {spin:>12} {med:>8.2f} {ratio:>10}")


if __name__ == "__main__":
    main()
