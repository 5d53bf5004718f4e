#!/usr/bin/python3
"""Served decode under a CFS CPU quota below the cores allowed (a Kubernetes CPU limit without
the static CPU manager): the launcher's default team, sized to the quota (DefaultTeamSize,
common/base/cpu_affinity.h), against a team of every allowed core (the default before it,
and OpenMP's own), in interleaved rounds of one run.

The script makes a cgroup with the quota, moves itself into it (the launcher and its nodes
start there), and removes it at the end. It needs root and a cpu cgroup with this process at
its root: cgroup v1 at /sys/fs/cgroup/cpu, or v2 at /sys/fs/cgroup with the cpu controller
enabled for children. Each round starts each deployment (co-located, the demo model), warms
it with one stream, and takes the median of 3 streamed 128-token completions.

  /usr/bin/python3 tests/bench/cpu_quota_bench.py --bin_dir="$(bazel info bazel-bin)" \
      [--quota_cores=1] [--rounds=4]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402


def enter_quota(cores):
    """Moves this process into a new cgroup with a quota of `cores` cores; returns (the
    cgroup's directory, its parent's)."""
    with open("/proc/self/cgroup") as f:
        cgroup = f.read()
    if os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") and ":cpu:/\n" in cgroup:
        root, files = "/sys/fs/cgroup/cpu", [("cpu.cfs_period_us", "100000"),
                                             ("cpu.cfs_quota_us", str(cores * 100000))]
    elif "0::/\n" in cgroup and "cpu" in open("/sys/fs/cgroup/cgroup.subtree_control").read():
        root, files = "/sys/fs/cgroup", [("cpu.max", f"{cores * 100000} 100000")]
    else:
        raise SystemExit("no cpu cgroup with this process at its root")
    path = os.path.join(root, f"strata-quota-bench-{os.getpid()}")
    os.mkdir(path)
    for name, value in files + [("cgroup.procs", str(os.getpid()))]:
        with open(os.path.join(path, name), "w") as f:
            f.write(value)
    return path, root


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--quota_cores", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    allowed = len(os.sched_getaffinity(0))
    if args.quota_cores >= allowed:
        raise SystemExit(f"--quota_cores must be below the {allowed} cores allowed")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    modes = {"default (quota)": [], f"--threads={allowed}": []}
    path, root = enter_quota(args.quota_cores)
    try:
        for r in range(args.rounds):
            for mode in (list(modes) if r % 2 == 0 else list(reversed(modes))):
                extra = [] if mode.startswith("default") else [mode]
                with compare_builds.launch(args.bin_dir, 0, extra, env=env) as (port, name, _):
                    compare_builds.stream_tokens_per_second(port, name, 16)  # warm-up
                    streams = [compare_builds.stream_tokens_per_second(port, name, 128)
                               for _ in range(3)]
                modes[mode].append(statistics.median(streams))
                print(f"round {r + 1} {mode}: {modes[mode][-1]:.2f} tok/s (streams "
                      f"{', '.join(f'{s:.1f}' for s in streams)})", file=sys.stderr, flush=True)
    finally:
        with open(os.path.join(root, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        os.rmdir(path)
    (quota, quota_rates), (every, every_rates) = modes.items()
    ratios = [a / b for a, b in zip(quota_rates, every_rates)]
    print(f"served single-stream decode, co-located, under a quota of {args.quota_cores} of "
          f"{allowed} allowed cores, medians of {args.rounds} interleaved rounds")
    print(f"{'team':<18} {'tok/s':>8}")
    for mode, rates in modes.items():
        print(f"{mode:<18} {statistics.median(rates):>8.2f}")
    print(f"{quota} / {every}, round by round: median {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f}, {max(ratios):.3f}]")


if __name__ == "__main__":
    main()
