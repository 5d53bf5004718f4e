#!/usr/bin/python3
"""Where serving's CPU goes: the CPU time (utime + stime, from /proc) of every thread of
the server, the compute nodes and the memory nodes over single-stream 128-token completions,
per generated token, by thread name. The step's OpenMP team all shows as "step" (the compute
node's step thread and its team); everything else in the server and the compute node is
what serving costs besides the forward pass ("serving", the last line but one), and on
shared cores all of it is time taken from the team. Memory nodes' threads are listed but
not counted there: they run attention.

Each --launcher_args entry is one configuration; they are launched alternately, --rounds
times each, and the table gives each thread's median over a configuration's rounds. The
clock tick is 10 ms here, so over 8 x 128 tokens a figure has a resolution of about
0.01 ms per token.

  /usr/bin/python3 tests/bench/serving_cpu.py --bin_dir="$(bazel info bazel-bin)" \\
      [--memory_nodes=0] [--rounds=2] [--streams=8] \\
      [--launcher_args="" --launcher_args="--server_args=--step_channel=grpc"]
"""
import argparse
import collections
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402

NODE_BINARIES = ("server", "compute_node", "memory_node")


def node_pids():
    """{binary name: [pid, ...]} of strata's processes now running."""
    out = collections.defaultdict(list)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                exe = os.path.basename(f.read().split(b"\0")[0].decode())
        except OSError:
            continue
        if exe in NODE_BINARIES:
            out[exe].append(pid)
    return out


def thread_ticks(pids):
    """{(binary, thread name): utime + stime in clock ticks} summed over threads."""
    ticks = collections.Counter()
    for exe, plist in pids.items():
        for pid in plist:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                ticks[(exe, name)] += int(fields[11]) + int(fields[12])
    return ticks


def measure(bin_dir, memory_nodes, launcher_args, streams):
    """({(binary, thread): ms per token}, [tok/s per stream]) over `streams` completions."""
    tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
    with compare_builds.launch(bin_dir, memory_nodes, launcher_args) as (port, model, _):
        compare_builds.stream_tokens_per_second(port, model, 16)  # warm up
        pids = node_pids()
        before = thread_ticks(pids)
        rates = [compare_builds.stream_tokens_per_second(port, model, 128)
                 for _ in range(streams)]
        after = thread_ticks(pids)
    tokens = streams * 128
    return {k: (after[k] - before.get(k, 0)) * tick_ms / tokens for k in after}, rates


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--memory_nodes", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--launcher_args", action="append",
                        help="a configuration: launcher flags, comma-separated (repeatable)")
    args = parser.parse_args()
    configs = args.launcher_args or [""]
    per_config = {c: collections.defaultdict(list) for c in configs}
    rates = {c: [] for c in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else list(reversed(configs))
        for c in order:
            extra = [a for a in c.split(",") if a]
            ms, got = measure(args.bin_dir, args.memory_nodes, extra, args.streams)
            for k, v in ms.items():
                per_config[c][k].append(v)
            rates[c].extend(got)
            print(f"round {r + 1} [{c or 'default'}]: median {statistics.median(got):.1f} tok/s",
                  file=sys.stderr)
    names = sorted({k for c in configs for k in per_config[c]})
    medians = {c: {k: statistics.median(per_config[c][k] + [0.0] * (
        args.rounds - len(per_config[c][k]))) for k in names} for c in configs}
    header = f"{'process':13s} {'thread':18s}" + "".join(f" {c or 'default':>24.24s}" for c in configs)
    print(f"CPU ms per generated token, medians of {args.rounds} launches per configuration, "
          f"{args.streams} streams of 128 tokens each, {args.memory_nodes} memory node(s)")
    print(header)
    shown = [k for k in names if max(medians[c][k] for c in configs) >= 0.005]
    shown.sort(key=lambda k: (k[0], -max(medians[c][k] for c in configs)))
    for k in shown:
        print(f"{k[0]:13s} {k[1]:18s}" + "".join(f" {medians[c][k]:24.3f}" for c in configs))
    print(f"{'serving':13s} {'(all but step)':18s}" + "".join(
        f" {sum(v for k, v in medians[c].items() if k[1] != 'step' and k[0] != 'memory_node'):24.3f}"
        for c in configs))
    print(f"{'':13s} {'tok/s (median)':18s}" + "".join(
        f" {statistics.median(rates[c]):24.1f}" for c in configs))


if __name__ == "__main__":
    main()
