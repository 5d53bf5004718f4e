#!/usr/bin/python3
"""Two builds of strata on the same benchmarks, interleaved in one run: for a change that
must not move a figure (a refactoring), or one that should. Each round runs every benchmark
once with the old build and once with the new, alternating which goes first; the figures
are medians over the rounds, with the new/old ratio.

A build is a directory laid out like bazel-bin, holding at least:
  compute_node/bench/decode_bench, compute_node/bench/offload_bench,
  memory_node/memory_node, compute_node/compute_node, server/server,
  deploy/local/launcher.

  /usr/bin/python3 tests/bench/compare_builds.py --old=/path/old_bin --new=/path/new_bin \
      [--rounds=3] [--benches=decode,offload,serve]

decode: decode_bench (batch 1 and 32, context 256): full-step tokens/s and step ms.
offload: offload_bench --mode=breakdown (batch 1 and 32, 2 memory nodes over UCX sm):
  co-located and offloaded step ms.
serve: the embedded default, co-located (launcher --memory_nodes=0), one streamed completion
  at a time (128 tokens, greedy, ignore_eos): decode tokens/s measured by the client from
  the first to the last token.
"""
import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ENV = dict(os.environ, OMP_NUM_THREADS="2", GOMP_SPINCOUNT="10000")


def table_rows(text, key_columns):
    """Rows of whitespace-separated numbers under a header starting with 'batch'."""
    rows, header = {}, None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "batch":
            header = fields
            continue
        if header and fields and re.fullmatch(r"\d+", fields[0]) and len(fields) == len(header):
            key = " ".join(f"{header[i]}={fields[i]}" for i in range(key_columns))
            rows[key] = {header[i]: fields[i] for i in range(key_columns, len(header))}
    return rows


def run_decode(bin_dir):
    out = subprocess.run(
        [f"{bin_dir}/compute_node/bench/decode_bench", "--batches=1,32", "--contexts=256",
         "--rounds=3"], env=ENV, capture_output=True, text=True, check=True, cwd="/tmp").stdout
    rows = table_rows(out, 2)
    return {f"decode {k} {col}": float(v[col]) for k, v in rows.items()
            for col in ("tok/s", "step_ms")}


def run_offload(bin_dir):
    out = subprocess.run(
        [f"{bin_dir}/compute_node/bench/offload_bench", "--mode=breakdown", "--batches=1,32",
         "--rounds=3", f"--memory_node_bin={bin_dir}/memory_node/memory_node"],
        env=ENV, capture_output=True, text=True, check=True, cwd="/tmp").stdout
    rows = table_rows(out, 1)
    return {f"offload {k} {col}": float(v[col]) for k, v in rows.items()
            for col in ("coloc_ms", "offload_ms")}


def stream_tokens_per_second(port, model, max_tokens):
    body = json.dumps({"model": model, "prompt": "The history of the", "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:
            if line.startswith(b"data: {"):
                times.append(time.monotonic())
    if len(times) < 2:
        raise RuntimeError(f"only {len(times)} events")
    return (len(times) - 1) / (times[-1] - times[0])


def plan_wait_ms(metrics_port):
    """Mean of compute-0's strata_compute_node_plan_wait_seconds, in ms."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    values = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"strata_compute_node_plan_wait_seconds_{part}"):
                values[part] = float(line.split()[-1])
    return 1000.0 * values["sum"] / values["count"] if values.get("count") else float("nan")


def wait_http(port, path, proc):
    """Until GET `path` on `port` answers 200; raises if `proc` exits or 10 minutes pass."""
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status == 200:
                return
        except Exception:  # noqa: BLE001: not up yet
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not start")


@contextlib.contextmanager
def launch(bin_dir, memory_nodes=0, extra_args=(), env=None, node_metrics=False):
    """The embedded default (deploy/local launcher) on free ports, until the block ends:
    yields (HTTP port, served model name, the launcher's port file) once /health is 200."""
    with tempfile.TemporaryDirectory() as run_dir:
        port_file = os.path.join(run_dir, "ports.json")
        log = open(os.path.join(run_dir, "launcher.log"), "w")
        launcher = subprocess.Popen(
            [f"{bin_dir}/deploy/local/launcher", f"--bin_dir={bin_dir}", "--port=0",
             "--grpc_port=-1", f"--port_file={port_file}", f"--memory_nodes={memory_nodes}",
             f"--node_metrics={'true' if node_metrics else 'false'}", *extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=env or ENV, start_new_session=True)
        try:
            for _ in range(1200):
                if launcher.poll() is not None:
                    raise RuntimeError("the launcher exited")
                if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                    break
                time.sleep(0.5)
            else:
                raise RuntimeError("the deployment did not start")
            port = json.load(open(port_file))["http"]
            wait_http(port, "/health", launcher)
            models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))
            yield port, models["data"][0]["id"], port_file
        finally:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=60)


def run_serve(bin_dir, memory_nodes=0, extra_args=(), env=None, rounds=3, plan_wait=False):
    """Median single-stream decode tokens/s of `rounds` streamed completions; with
    `plan_wait`, also the compute node's mean wait for its next plan between steps."""
    with launch(bin_dir, memory_nodes, extra_args, env, node_metrics=plan_wait) as (
            port, model, port_file):
        stream_tokens_per_second(port, model, 16)  # warm-up
        rates = [stream_tokens_per_second(port, model, 128) for _ in range(rounds)]
        result = {"serve single-stream decode tok/s": statistics.median(rates)}
        if plan_wait:
            metrics_port = json.load(open(port_file))["metrics"]["compute-0"]
            result["plan wait ms"] = plan_wait_ms(metrics_port)
        return result


BENCHES = {"decode": run_decode, "offload": run_offload, "serve": run_serve}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--benches", default="decode,offload,serve")
    args = parser.parse_args()
    figures = {"old": {}, "new": {}}
    for r in range(args.rounds):
        for bench in args.benches.split(","):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for which in order:
                result = BENCHES[bench](getattr(args, which))
                for name, value in result.items():
                    figures[which].setdefault(name, []).append(value)
                print(f"round {r + 1} {bench} {which}: " +
                      ", ".join(f"{k.split(' ', 1)[1]} {v:.2f}" for k, v in result.items()),
                      file=sys.stderr, flush=True)
    print(f"medians of {args.rounds} interleaved rounds (old: {args.old}, new: {args.new})")
    print(f"{'figure':<42} {'old':>10} {'new':>10} {'new/old':>8}")
    for name in figures["old"]:
        old = statistics.median(figures["old"][name])
        new = statistics.median(figures["new"][name])
        print(f"{name:<42} {old:>10.2f} {new:>10.2f} {new / old:>8.3f}")


if __name__ == "__main__":
    main()
