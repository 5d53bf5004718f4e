#!/usr/bin/python3
"""strata against llama.cpp on identical weights, interleaved, medians, ratios (issue 16).

Given a llama.cpp build directory (built outside this repository with -DGGML_NATIVE=ON; its
binaries in BUILD/bin), this exports the demo model to GGUF (tests/bench/export_gguf.py),
then runs, in --rounds rounds whose order alternates:
  tg       llama-bench tg at batch 1 (-n 128 at depth --tg_depth) against decode_bench
           --batches=1 at the same context;
  pp       llama-bench pp (-p N for each of --prompts: one sequence's prompt from an empty
           context) against prefill_bench at the same prompt lengths (not in the default
           --parts);
  batched  llama-batched-bench S_TG at --sequences and --contexts against decode_bench at
           the same batches and contexts;
  served   llama-server against the launcher (deploy/local; --memory_nodes, co-located by
           default) at 1 and --clients streaming clients (the median of 3 bursts per
           launch), 128 tokens each from a 64-token prompt of token ids, greedy. Before
           timing, both servers answer the same prompt with 16 greedy tokens, and the
           script prints how many agree (a check that the GGUF is the same model: bf16
           rounding differs between the two, so the tail may diverge).
Without --llama_dir it runs strata alone and says that the peer was skipped. It prints the
medians over the rounds and their ratios, then, for tg and served, each round's own ratio
(the two engines' runs of a round are close in time; the machine's phase moves between
rounds).

  /usr/bin/python3 tests/bench/peer_bench.py --bin_dir="$(bazel info bazel-bin)" \\
      --llama_dir=/path/to/llama.cpp/build [--rounds=3] [--parts=tg,batched,served,pp]
      [--threads=2] [--kv_cache_dtype=f16]

--kv_cache_dtype=f16 runs strata with an f16 KV cache, the type llama.cpp's cache has by
default (strata's default is bf16; both take 2 bytes an element).
"""
import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402
import export_gguf  # noqa: E402

THREADS = 2
# decode_bench's streaming-read probe (GB/s) and the step's fraction of the read bound, by
# (batch, context), one entry per run: the machine's state beside each figure.
PROBES = {}
PROMPT = [3 + (i * 7919) % 31000 for i in range(64)]


def gguf_of(model):
    out = os.path.join(model, "model.gguf")
    source = os.path.join(model, "model.safetensors")
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(source):
        export_gguf.export(model, out)
    return out


# strata's KV cache type (--kv_cache_dtype): decode_bench's and the served deployment's.
KV_CACHE_DTYPE = ["bf16"]


def decode_bench(bin_dir, model, batches, contexts):
    out = subprocess.run(
        [f"{bin_dir}/compute_node/bench/decode_bench", f"--model={model}",
         f"--batches={','.join(map(str, batches))}",
         f"--contexts={','.join(map(str, contexts))}", "--rounds=3",
         f"--kv_cache_dtype={KV_CACHE_DTYPE[0]}"],
        env=compare_builds.ENV, capture_output=True, text=True, check=True, cwd="/tmp").stdout
    rows = compare_builds.table_rows(out, 2)
    for b in batches:
        for c in contexts:
            row = rows[f"batch={b} ctx={c}"]
            # decode_bench gives the read-bound fraction at batch 1 only ("-" elsewhere).
            bound = None if row["bound_frac"] == "-" else float(row["bound_frac"])
            PROBES.setdefault((b, c), []).append((float(row["probe"]), bound))
    return {(b, c): float(rows[f"batch={b} ctx={c}"]["tok/s"]) for b in batches for c in contexts}


def llama_bench_tg(llama_dir, gguf, depth):
    out = subprocess.run(
        [f"{llama_dir}/bin/llama-bench", "-m", gguf, "-p", "0", "-n", "128", "-d", str(depth),
         "-t", str(THREADS), "-r", "3", "-o", "json"],
        capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def prefill_bench(bin_dir, model, prompts):
    out = subprocess.run(
        [f"{bin_dir}/compute_node/bench/prefill_bench", f"--model={model}",
         f"--prompts={','.join(map(str, prompts))}", "--rounds=3"],
        env=compare_builds.ENV, capture_output=True, text=True, check=True, cwd="/tmp").stdout
    rows = compare_builds.table_rows(out, 1, first="prompt")
    return {p: float(rows[f"prompt={p}"]["tok/s"]) for p in prompts}


def llama_bench_pp(llama_dir, gguf, prompts):
    out = subprocess.run(
        [f"{llama_dir}/bin/llama-bench", "-m", gguf, "-p", ",".join(map(str, prompts)), "-n",
         "0", "-t", str(THREADS), "-r", "3", "-o", "json"],
        capture_output=True, text=True, check=True).stdout
    return {int(r["n_prompt"]): float(r["avg_ts"]) for r in json.loads(out)}


def llama_batched(llama_dir, gguf, sequences, context):
    ctx = max(sequences) * (context + 32) + 256
    out = subprocess.run(
        [f"{llama_dir}/bin/llama-batched-bench", "-m", gguf, "-c", str(ctx), "-b", "2048",
         "-ub", "512", "-npp", str(context), "-ntg", "32",
         "-npl", ",".join(map(str, sequences)), "-t", str(THREADS)],
        capture_output=True, text=True, check=True).stdout
    # |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s | ...
    result = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[0].isdigit():
            result[int(cells[2])] = float(cells[7])
    return result


def greedy_tokens(port, model, n, kind):
    """n greedy token ids for PROMPT: strata's OpenAI endpoint with token ids as logprob
    entries, llama-server's own /completion with return_tokens."""
    if kind == "strata":
        path = "/v1/completions"
        body = {"model": model, "prompt": PROMPT, "max_tokens": n, "temperature": 0,
                "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    else:
        path = "/completion"
        body = {"prompt": PROMPT, "n_predict": n, "temperature": 0, "ignore_eos": True,
                "return_tokens": True}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    j = json.load(urllib.request.urlopen(request, timeout=600))
    if kind == "strata":
        return [int(t.split(":")[1]) for t in j["choices"][0]["logprobs"]["tokens"]]
    return j["tokens"]


def throughput(port, model, clients, max_tokens=128):
    """Generated tokens per second over `clients` concurrent streams (read on one thread:
    compare_builds.streams_event_times)."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    if model:
        body["model"] = model
    start = time.monotonic()
    streams = compare_builds.streams_event_times(port, [body] * clients)
    elapsed = time.monotonic() - start
    return sum(len(compare_builds.token_event_times(t, max_tokens)) for t in streams) / elapsed


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(llama_dir, gguf, clients, context=512):
    """llama-server on a free port, until the block ends: yields (port, None, None) once its
    /health is 200, as compare_builds.launch yields for strata. Each client's slot holds
    `context` tokens."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [f"{llama_dir}/bin/llama-server", "-m", gguf, "-t", str(THREADS), "-c",
         str(clients * context), "-np", str(clients), "--port", str(port), "--host", "127.0.0.1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        compare_builds.wait_http(port, "/health", proc)
        yield port, None, None
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def main():
    global THREADS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--llama_dir", default="")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="tg,batched,served")
    parser.add_argument("--tg_depth", type=int, default=256)
    parser.add_argument("--prompts", default="128,512", help="the pp part's prompt lengths")
    parser.add_argument("--sequences", default="1,8,32,64")
    parser.add_argument("--contexts", default="256,2048")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--memory_nodes", type=int, default=0)
    parser.add_argument("--threads", type=int, default=THREADS,
                        help="threads of both in tg and batched (decode_bench's OpenMP team, "
                             "llama.cpp's -t); the served part runs at 2 only (the launcher's "
                             "layout) and is skipped otherwise; the issue's figures use 2")
    parser.add_argument("--kv_cache_dtype", default="bf16", choices=["bf16", "f16"],
                        help="strata's KV cache type, in decode_bench and the served "
                             "deployment (llama.cpp's cache is f16 unless told otherwise)")
    parser.add_argument("--gemm", default="",
                        help="strata's GEMM (STRATA_GEMM for decode_bench and the compute "
                             "nodes): auto, own or onednn; empty: the default")
    args = parser.parse_args()
    THREADS = args.threads
    compare_builds.ENV["OMP_NUM_THREADS"] = str(THREADS)
    KV_CACHE_DTYPE[0] = args.kv_cache_dtype
    if args.gemm:
        os.environ["STRATA_GEMM"] = args.gemm
        compare_builds.ENV["STRATA_GEMM"] = args.gemm
    model = compare_builds.demo_model()
    peer = bool(args.llama_dir)
    if not peer:
        print("no --llama_dir: llama.cpp skipped, strata's figures alone")
    gguf = gguf_of(model) if peer else None
    parts = args.parts.split(",")
    if "served" in parts and THREADS != 2:
        print(f"served part skipped: the launcher lays its processes out for 2 threads, "
              f"not --threads={THREADS}")
        parts.remove("served")
    sequences = [int(s) for s in args.sequences.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    results = {}

    def record(key, value):
        results.setdefault(key, []).append(value)
        print(f"  {key}: {value:.2f}", file=sys.stderr, flush=True)

    runs = []
    if "tg" in parts:
        runs.append(("tg strata", lambda: record(
            ("tg", "strata"), decode_bench(args.bin_dir, model, [1], [args.tg_depth])[
                (1, args.tg_depth)])))
        if peer:
            runs.append(("tg llama.cpp", lambda: record(
                ("tg", "llama.cpp"), llama_bench_tg(args.llama_dir, gguf, args.tg_depth))))
    if "pp" in parts:
        prompts = [int(p) for p in args.prompts.split(",")]

        def strata_pp():
            for p, v in prefill_bench(args.bin_dir, model, prompts).items():
                record(("pp", p, "strata"), v)
        runs.append(("pp strata", strata_pp))
        if peer:
            def llama_pp():
                for p, v in llama_bench_pp(args.llama_dir, gguf, prompts).items():
                    record(("pp", p, "llama.cpp"), v)
            runs.append(("pp llama.cpp", llama_pp))
    if "batched" in parts:
        def strata_batched():
            for (b, c), v in decode_bench(args.bin_dir, model, sequences, contexts).items():
                record(("batched", b, c, "strata"), v)
        runs.append(("batched strata", strata_batched))
        if peer:
            def llama_batched_all():
                for c in contexts:
                    for b, v in llama_batched(args.llama_dir, gguf, sequences, c).items():
                        record(("batched", b, c, "llama.cpp"), v)
            runs.append(("batched llama.cpp", llama_batched_all))
    if "served" in parts:
        def served(kind):
            def run():
                env = {k: v for k, v in os.environ.items()
                       if k not in ("OMP_NUM_THREADS", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
                server = (compare_builds.launch(args.bin_dir, args.memory_nodes,
                                                [f"--threads={THREADS}",
                                                 f"--kv_cache_dtype={args.kv_cache_dtype}"],
                                                env=env)
                          if kind == "strata" else
                          llama_server(args.llama_dir, gguf, args.clients))
                with server as (port, name, _):
                    results.setdefault(("greedy", kind), greedy_tokens(port, name, 16, kind))
                    throughput(port, name, 1, 16)  # warm-up
                    # The median of 3 bursts per launch: one burst moved by a quarter with
                    # the machine's memory bandwidth from one launch to the next.
                    for n in (1, args.clients):
                        record(("served", n, kind),
                               statistics.median(throughput(port, name, n) for _ in range(3)))
            return run
        runs.append(("served strata", served("strata")))
        if peer:
            runs.append(("served llama.cpp", served("llama.cpp")))

    for r in range(args.rounds):
        order = runs if r % 2 == 0 else list(reversed(runs))
        for name, run in order:
            print(f"round {r + 1}: {name}", file=sys.stderr, flush=True)
            run()

    def median(key):
        return statistics.median(results[key]) if key in results else float("nan")

    print(f"\nmedians of {args.rounds} interleaved rounds, {THREADS} threads, the demo model "
          f"(bf16); tok/s")
    print(f"{'measurement':<34} {'llama.cpp':>10} {'strata':>10} {'strata/llama':>13}")

    def row(label, ours, theirs):
        ratio = ours / theirs if theirs == theirs and theirs > 0 else float("nan")
        print(f"{label:<34} {theirs:>10.2f} {ours:>10.2f} {ratio:>13.3f}")
    if "tg" in parts:
        row(f"decode batch 1, ctx {args.tg_depth}", median(("tg", "strata")),
            median(("tg", "llama.cpp")))
    if "pp" in parts:
        for p in prompts:
            row(f"prefill, prompt {p} (pp{p})", median(("pp", p, "strata")),
                median(("pp", p, "llama.cpp")))
    if "batched" in parts:
        for c in contexts:
            for b in sequences:
                row(f"decode {b} seqs, ctx {c} (S_TG)", median(("batched", b, c, "strata")),
                    median(("batched", b, c, "llama.cpp")))
    if PROBES:
        print("\ndecode_bench's read probe (GB/s) and the step's fraction of the read bound "
              "(weights + KV over the probe), medians over the rounds")
        for (b, c), values in sorted(PROBES.items()):
            bounds = [v[1] for v in values if v[1] is not None]
            bound = f", bound fraction {statistics.median(bounds):.3f}" if bounds else ""
            print(f"  batch {b} ctx {c}: probe {statistics.median(v[0] for v in values):.1f}"
                  f"{bound}")
    if "served" in parts:
        for n in (1, args.clients):
            row(f"served, {n} client(s)", median(("served", n, "strata")),
                median(("served", n, "llama.cpp")))
    # The two engines' runs of one round are minutes apart at most, the rounds further: each
    # round's own ratio shows how far the machine's phase moved the figures above.
    paired = [(f"decode batch 1, ctx {args.tg_depth}", ("tg", "strata"), ("tg", "llama.cpp"))]
    paired += [(f"served, {n} client(s)", ("served", n, "strata"), ("served", n, "llama.cpp"))
               for n in (1, args.clients)]
    lines = []
    for label, ours, theirs in paired:
        ratios = [a / b for a, b in zip(results.get(ours, []), results.get(theirs, [])) if b > 0]
        if ratios:
            lines.append(f"  {label}: {statistics.median(ratios):.3f} [{min(ratios):.3f}, "
                         f"{max(ratios):.3f}] ({', '.join(f'{r:.3f}' for r in ratios)})")
    if lines:
        print("\neach round's own strata/llama ratio: median [lowest, highest] (by round)")
        print("\n".join(lines))
    if "served" in parts:
        if peer and ("greedy", "strata") in results and ("greedy", "llama.cpp") in results:
            a, b = results[("greedy", "strata")], results[("greedy", "llama.cpp")]
            agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"\nsame prompt, 16 greedy tokens: the first {agree} agree\n  strata    {a}\n"
                  f"  llama.cpp {b}")


if __name__ == "__main__":
    main()
