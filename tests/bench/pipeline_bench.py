#!/usr/bin/python3
"""Two batches in flight (issue "Two batches in flight on one compute node"): decode
throughput and time per output token of the embedded default in three modes, against rows
per batch and context, in interleaved rounds of one run (medians).

  co-located        launcher --memory_nodes=0 on every core (the baseline to beat);
  offloaded, off    one memory node, the cores partitioned: --compute_cpus (compute node and
                    scheduler) and --memory_cpus (the memory node), with asynchronous
                    scheduling (the best one-batch mode);
  offloaded, two    the same partition with --pipelining=two.

The partition emulates the heterogeneous split on one machine: compute hardware and memory
hardware that do not contend. Every offloaded mode uses the same partition.

Workload at each (rows B, context C): B streamed completions at once, whose prompts share
C - 8 tokens (cached once, so prefill is cheap) and differ in their last 8, so every decode
row reads its own C-token context. Throughput counts the tokens that arrive while all B
streams decode (from the last stream's first token to the first stream's last token).
TPOT is the median over streams of their mean inter-token time in that window.

The compute node's and memory node's bubble ratios (idle over wall time while the point
ran) come from their /metrics: compute idle is its step thread waiting for attention or for
a plan; memory idle is wall time minus attention time.

  /usr/bin/python3 tests/bench/pipeline_bench.py --bin_dir="$(bazel info bazel-bin)" \
      [--rounds=3] [--rows=8,32] [--contexts=256,1024] [--tokens=48]
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402


def partition_flags(compute_cpus, memory_cpus):
    """Launcher flags for the offloaded partition: compute node and scheduler on
    `compute_cpus`, one memory node on `memory_cpus`, UCX shared memory, 1 GiB of KV."""
    return [f"--compute_cpus={compute_cpus}", f"--memory_cpus={memory_cpus}", "--memory_nodes=1",
            "--data_plane=sm", "--memory_kv_budget_mib=1024"]


def modes(compute_cpus, memory_cpus):
    partition = partition_flags(compute_cpus, memory_cpus)
    return {
        "co-located": ["--memory_nodes=0", "--kv_budget_mib=1024"],
        "offloaded off": partition + ["--async_scheduling"],
        "offloaded two": partition + ["--pipelining=two"],
    }


def metric_values(port, names):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        for name in names:
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[name] += float(line.split()[-1])
    return out


PLAN_WAIT = "strata_compute_node_plan_wait_seconds_sum"  # time waited for a plan
COMPUTE_IDLE = ["strata_compute_node_attention_wait_seconds_total", PLAN_WAIT]
MEMORY_BUSY = ["strata_memory_node_attention_seconds_total"]
PLAN_WAITS = "strata_compute_node_plan_wait_seconds_count"  # waits for a plan, counted


def stream(port, model, prompt, tokens, times, errors):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            for line in response:
                if line.startswith(b"data: {"):
                    times.append(time.monotonic())
    except Exception as e:  # noqa: BLE001 - reported, and the point is void
        errors.append(str(e))


def stream_all(port, model, prompts, tokens, times, errors):
    """Streams every prompt at once, each on a thread of its own (times[i] for prompts[i]),
    and returns when all have ended."""
    threads = [threading.Thread(target=stream, args=(port, model, p, tokens, t, errors))
               for p, t in zip(prompts, times)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def thread_cpu_seconds(pid):
    """CPU seconds each thread of a process has run (its tid: seconds), from /proc."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[0]) / 1e9
        except OSError:
            pass  # the thread ended
    return out


def serving_cpu_seconds(before, after):
    """CPU between two snapshots ({process: thread_cpu_seconds}) that serving took: every
    thread of the server, and every thread of each compute node but its busiest (the step
    thread: the validation's compute nodes run one compute thread)."""
    total = 0.0
    for name, threads in after.items():
        used = sorted(max(0.0, cpu - before[name].get(tid, 0.0)) for tid, cpu in threads.items())
        total += sum(used) if name == "server" else sum(used[:-1])
    return total


def run_point(port, model, rows, context, tokens, seed, metrics_ports, shared_prefix=True,
              pids=None):
    """With `shared_prefix`, the rows' prompts differ only in their last 8 tokens, and the
    common part is cached first: the prefill is short, but every row attends to the same
    KV, which the memory node then reads from its caches rather than from DRAM. Without it,
    every row has a prompt of its own, as in serving unrelated requests, each cached by a
    one-token request first."""
    rng = random.Random(seed)
    if shared_prefix:
        prefix = [rng.randrange(3, 30000) for _ in range(context - 8)]
        prompts = [prefix + [rng.randrange(3, 30000) for _ in range(8)] for _ in range(rows)]
        # Cache the shared prefix first.
        stream(port, model, prefix + [5] * 8, 1, [], [])
    else:
        prompts = [[rng.randrange(3, 30000) for _ in range(context)] for _ in range(rows)]
        # Cache each prompt first (one token each, all at once), so that the streams below
        # start decoding together instead of waiting on each other's prefill.
        stream_all(port, model, prompts, 1, [[] for _ in prompts], [])
    def metrics():
        return {role: metric_values(p, COMPUTE_IDLE + [PLAN_WAITS] if role == "compute" else
                                    MEMORY_BUSY)
                for role, p in metrics_ports.items()}

    def cpu():
        return {name: thread_cpu_seconds(pid) for name, pid in (pids or {}).items()}

    before, cpu_before = metrics(), cpu()
    start = time.monotonic()
    times = [[] for _ in range(rows)]
    errors = []
    stream_all(port, model, prompts, tokens, times, errors)
    wall = time.monotonic() - start
    cpu_after = cpu()
    if errors or any(len(t) < tokens // 2 for t in times):
        raise RuntimeError(f"rows={rows} ctx={context}: {errors[:3]}")
    after = metrics()
    steps = max(len(t) for t in times)  # every row streams one token per step
    begin = max(t[0] for t in times)
    end = min(t[-1] for t in times)
    count = sum(sum(1 for x in t if begin < x <= end) for t in times)
    tpot = statistics.median((t[-1] - t[0]) / (len(t) - 1) for t in times)
    result = {"tok/s": count / (end - begin) if end > begin else float("nan"),
              "tpot_ms": 1000 * tpot}
    if "compute" in metrics_ports:
        idle = sum(after["compute"][n] - before["compute"][n] for n in COMPUTE_IDLE)
        result["compute_bubble"] = idle / wall
        # The compute node's mean wait for its next plan, over the waits it had.
        waits = after["compute"][PLAN_WAITS] - before["compute"][PLAN_WAITS]
        waited = after["compute"][PLAN_WAIT] - before["compute"][PLAN_WAIT]
        result["plan_wait_ms"] = 1000 * waited / waits if waits else 0.0
    if pids:
        result["serving_cpu_ms"] = 1000 * serving_cpu_seconds(cpu_before, cpu_after) / steps
    if "memory" in metrics_ports:
        busy = after["memory"][MEMORY_BUSY[0]] - before["memory"][MEMORY_BUSY[0]]
        result["memory_bubble"] = max(0.0, 1 - busy / wall)
        # Per step: the memory node's time handling layer frames (KV writes, attention,
        # framing).
        result["memory_busy_ms"] = 1000 * busy / steps
    return result


def run_mode(bin_dir, args, grid, tokens, seed, shared_prefix=True):
    with tempfile.TemporaryDirectory() as run_dir:
        port_file = os.path.join(run_dir, "ports.json")
        log = open(os.path.join(run_dir, "launcher.log"), "w")
        launcher = subprocess.Popen(
            [f"{bin_dir}/deploy/local/launcher", f"--bin_dir={bin_dir}", "--port=0",
             "--grpc_port=-1", f"--port_file={port_file}", *args], stdout=log,
            stderr=subprocess.STDOUT, env=compare_builds.ENV, start_new_session=True)
        try:
            for _ in range(1200):
                if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                    break
                if launcher.poll() is not None:
                    raise RuntimeError(open(log.name).read()[-2000:])
                time.sleep(0.5)
            else:
                raise RuntimeError("the deployment did not start")
            ports = json.load(open(port_file))
            port = ports["http"]
            model = json.load(urllib.request.urlopen(
                f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
            metrics_ports = {"compute": ports["metrics"]["compute-0"]}
            if "memory-0" in ports["metrics"]:
                metrics_ports["memory"] = ports["metrics"]["memory-0"]
            pids = {name: pid for name, pid in ports["pids"].items()
                    if name == "server" or name.startswith("compute-")}
            run_point(port, model, 4, 64, 8, seed, metrics_ports)  # warm-up
            return {point: run_point(port, model, point[0], point[1], tokens, seed,
                                     metrics_ports, shared_prefix, pids) for point in grid}
        finally:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="8,32")
    parser.add_argument("--contexts", default="256,1024")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--compute_cpus", default=None)
    parser.add_argument("--memory_cpus", default=None)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs two cores to partition")
    compute_cpus = args.compute_cpus or str(cpus[0])
    memory_cpus = args.memory_cpus or ",".join(str(c) for c in cpus[1:])
    grid = [(int(r), int(c)) for r in args.rows.split(",") for c in args.contexts.split(",")]
    all_modes = modes(compute_cpus, memory_cpus)
    results = {name: {point: [] for point in grid} for name in all_modes}
    names = list(all_modes)
    for round_index in range(args.rounds):
        # Interleaved: each round runs every mode, in a rotated order.
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for name in order:
            got = run_mode(args.bin_dir, all_modes[name], grid, args.tokens, 7 + round_index)
            for point, figures in got.items():
                results[name][point].append(figures)
            print(f"round {round_index + 1}: {name} done", file=sys.stderr, flush=True)

    def median(name, point, key):
        values = [r[key] for r in results[name][point] if key in r]
        return statistics.median(values) if values else float("nan")

    print(f"partition: compute {compute_cpus} | memory {memory_cpus}; "
          f"co-located on all of {','.join(map(str, cpus))}; {args.rounds} rounds, medians")
    print(f"{'rows':>5} {'ctx':>5} | {'colo tok/s':>10} {'off tok/s':>10} {'two tok/s':>10} | "
          f"{'two/off':>7} {'two/colo':>8} | {'colo tpot':>9} {'off tpot':>9} {'two tpot':>9} | "
          f"{'off bub c/m':>11} {'two bub c/m':>11}")
    for point in grid:
        colo, off, two = (median(n, point, "tok/s") for n in names)
        tpots = [median(n, point, "tpot_ms") for n in names]
        bubbles = [f"{median(n, point, 'compute_bubble'):.2f}/{median(n, point, 'memory_bubble'):.2f}"
                   for n in names[1:]]
        print(f"{point[0]:>5} {point[1]:>5} | {colo:>10.1f} {off:>10.1f} {two:>10.1f} | "
              f"{two / off:>7.2f} {two / colo:>8.2f} | {tpots[0]:>9.1f} {tpots[1]:>9.1f} "
              f"{tpots[2]:>9.1f} | {bubbles[0]:>11} {bubbles[1]:>11}")


if __name__ == "__main__":
    main()
