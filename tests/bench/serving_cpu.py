#!/usr/bin/python3
"""Where serving's CPU goes: the CPU time of every thread of the server, the compute nodes
and the memory nodes over single-stream 128-token completions, per generated token, by
thread name. The time is the kernel scheduler's own count of each thread's run time, in ns
(/proc's schedstat; utime and stime count 10 ms clock ticks, about 0.01 ms per token over
8 x 128 tokens). The step's OpenMP team all shows as "step" (the compute node's step thread
and its team); everything else in the server and the compute node is what serving costs
besides the forward pass ("serving", the last line but one), and on shared cores all of it
is time taken from the team. Memory nodes' threads are listed but not counted there: they
run attention.

A second table counts each thread's wake-ups per token (voluntary context switches: it
slept and was woken).

Each --launcher_args entry is one configuration, run on each --bin_dir given (a build:
a directory laid out like bazel-bin); they are launched alternately, --rounds times each,
and the tables give each thread's median over a configuration's rounds.

  /usr/bin/python3 tests/bench/serving_cpu.py --bin_dir="$(bazel info bazel-bin)" \\
      [--bin_dir=OTHER_BUILD] [--memory_nodes=0] [--rounds=2] [--streams=8] \\
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


def thread_cpu(pids):
    """({(binary, thread name): CPU time in ns, from /proc's schedstat}, {same: voluntary
    context switches}), each summed over the threads of that name."""
    cpu_ns = collections.Counter()
    wakes = collections.Counter()
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
                try:
                    # The scheduler's own count of the thread's run time, in ns.
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        cpu_ns[(exe, name)] += int(f.read().split()[0])
                except OSError:
                    continue
                try:
                    with open(f"/proc/{pid}/task/{tid}/status") as f:
                        for line in f:
                            if line.startswith("voluntary_ctxt_switches:"):
                                wakes[(exe, name)] += int(line.split()[1])
                except OSError:
                    pass
    return cpu_ns, wakes


def own_cpu_ns():
    """This script's CPU time (its main thread, which runs the client), in ns."""
    with open(f"/proc/self/task/{os.getpid()}/schedstat") as f:
        return int(f.read().split()[0])


def measure(bin_dir, memory_nodes, launcher_args, streams):
    """({(binary, thread): ms per token}, {(binary, thread): wake-ups per token},
    [tok/s per stream], the client's ms per token) over `streams` completions."""
    with compare_builds.launch(bin_dir, memory_nodes, launcher_args) as (port, model, _):
        compare_builds.stream_tokens_per_second(port, model, 16)  # warm up
        pids = node_pids()
        before, woken_before = thread_cpu(pids)
        client_before = own_cpu_ns()
        rates = [compare_builds.stream_tokens_per_second(port, model, 128)
                 for _ in range(streams)]
        client_after = own_cpu_ns()
        after, woken_after = thread_cpu(pids)
    tokens = streams * 128
    return ({k: (after[k] - before.get(k, 0)) / 1e6 / tokens for k in after},
            {k: (woken_after[k] - woken_before.get(k, 0)) / tokens for k in woken_after}, rates,
            (client_after - client_before) / 1e6 / tokens)


def print_table(title, configs, per_config, rounds, threshold, fmt, total):
    names = sorted({k for c in configs for k in per_config[c]})
    medians = {c: {k: statistics.median(per_config[c][k] + [0.0] * (rounds - len(per_config[c][k])))
                   for k in names} for c in configs}
    print(title)
    print(f"{'process':13s} {'thread':18s}" + "".join(f" {c[0]:>24.24s}" for c in configs))
    shown = [k for k in names if max(medians[c][k] for c in configs) >= threshold]
    shown.sort(key=lambda k: (k[0], -max(medians[c][k] for c in configs)))
    for k in shown:
        print(f"{k[0]:13s} {k[1]:18s}" + "".join(f" {medians[c][k]:24{fmt}}" for c in configs))
    if total:
        print(f"{'serving':13s} {'(all but step)':18s}" + "".join(
            f" {sum(v for k, v in medians[c].items() if k[1] != 'step' and k[0] != 'memory_node'):24{fmt}}"
            for c in configs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin_dir", action="append", required=True,
                        help="a build (repeatable: each configuration runs on each)")
    parser.add_argument("--memory_nodes", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--launcher_args", action="append",
                        help="a configuration: launcher flags, comma-separated (repeatable)")
    args = parser.parse_args()
    configs = compare_builds.configurations(args.bin_dir, args.launcher_args)
    cpu = {c: collections.defaultdict(list) for c in configs}
    woken = {c: collections.defaultdict(list) for c in configs}
    rates = {c: [] for c in configs}
    client = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in (configs if r % 2 == 0 else list(reversed(configs))):
            extra = [a for a in c[2].split(",") if a]
            ms, wakes, got, client_ms = measure(c[1], args.memory_nodes, extra, args.streams)
            client[c].append(client_ms)
            for k, v in ms.items():
                cpu[c][k].append(v)
            for k, v in wakes.items():
                woken[c][k].append(v)
            rates[c].extend(got)
            print(f"round {r + 1} [{c[0]}]: median {statistics.median(got):.1f} tok/s",
                  file=sys.stderr)
    for c in configs:
        print(f"{c[0]}: {c[1]}")
    print_table(f"CPU ms per generated token, medians of {args.rounds} launches per configuration, "
                f"{args.streams} streams of 128 tokens each, {args.memory_nodes} memory node(s)",
                configs, cpu, args.rounds, 0.005, ".3f", True)
    print(f"{'client':13s} {'(this script)':18s}" + "".join(
        f" {statistics.median(client[c]):24.3f}" for c in configs))
    print(f"{'':13s} {'tok/s (median)':18s}" + "".join(
        f" {statistics.median(rates[c]):24.1f}" for c in configs))
    print_table("wake-ups (voluntary context switches) per generated token, medians",
                configs, woken, args.rounds, 0.05, ".2f", True)


if __name__ == "__main__":
    main()
