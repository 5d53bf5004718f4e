#!/usr/bin/python3
"""What the step loop costs: served single-stream decode against the compute node's own
batch-1 step rate on the same weights, in interleaved rounds of one run (issue "The step
loop": served should reach 95% of in-process).

  co-located:      deploy/local launcher --memory_nodes=0, one streamed completion at a time
                   (128 tokens, greedy), against decode_bench --batches=1;
  2 memory nodes:  launcher --memory_nodes=2 --data_plane=sm, against offload_bench
                   --mode=breakdown --batches=1 (2 memory nodes over UCX shared memory).

Each layout is served twice: with synchronous scheduling (--async_scheduling=false: the
next plan is built when the last result is back) and with asynchronous scheduling, the
launcher's default (the next plan is at the node already).

Both in-process benchmarks run at context 64 (the served stream's mean context is about
70), on the launcher's demo model. Medians of the rounds, and served/in-process; also each
round's own served/in-process ratio (a pair of figures a minute or two apart), their median
and range, and the compute node's figures over the served streams: its waits for plans and
its own step time, which split what serving loses into waiting and slower steps.

With --pairs=N the rounds above are skipped for a finer interleave, because the machine's
speed moves within the minute or two a round takes: each layout's deployment (asynchronous
scheduling, the launcher's default) is started once and left up, idle between streams, and
N pairs alternate one in-process measurement (co-located: a decode_bench run of one round;
2 memory nodes: one round of 24 steps of an offload_bench process kept up beside it,
--rounds_on_stdin) with one streamed 128-token completion, a second or so apart. It prints
the median of the pairs' served/in-process ratios, their range, and the pairs at 0.95 or
above. Under it, "steady minutes": the streams whose nearest in-process measurements before
and after agree within 5% of their mean, each over that mean (steady_ratios), so that a
pair taken across a change of the machine's speed does not count as the step loop's.

With --llama_dir (a llama.cpp build directory, built outside the repository), llama-server
serves the same weights (exported to GGUF by export_gguf.py) with as many threads, and the
same streamed completion is timed in the same rounds.

  /usr/bin/python3 tests/bench/step_loop_bench.py --bin_dir="$(bazel info bazel-bin)" \
      [--rounds=3 | --pairs=20] [--llama_dir=DIR] \
      [--launcher_args="--server_args=--plan_ahead_lead=1"] [--memory_nodes=0,2]
"""
import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402

CONTEXT = 64


def in_process_colocated(bin_dir, model, rounds=3):
    out = subprocess.run(
        [f"{bin_dir}/compute_node/bench/decode_bench", f"--model={model}", "--batches=1",
         f"--contexts={CONTEXT}", f"--rounds={rounds}"], env=compare_builds.ENV, capture_output=True,
        text=True, check=True, cwd="/tmp").stdout
    rows = compare_builds.table_rows(out, 2)
    return float(rows[f"batch=1 ctx={CONTEXT}"]["tok/s"])


def in_process_offloaded(bin_dir, model):
    out = subprocess.run(
        [f"{bin_dir}/compute_node/bench/offload_bench", "--mode=breakdown", f"--model={model}",
         "--batches=1", f"--ctx={CONTEXT}", "--rounds=3",
         f"--memory_node_bin={bin_dir}/memory_node/memory_node"],
        env=compare_builds.ENV, capture_output=True, text=True, check=True, cwd="/tmp").stdout
    rows = compare_builds.table_rows(out, 1)
    return 1000.0 / float(rows["batch=1"]["offload_ms"])


STEADY = 0.05


def steady_ratios(sequence):
    """Served over in-process for the streams taken in a steady minute: each stream with an
    in-process measurement before and after it (the nearest on either side) that agree
    within STEADY of their mean, over that mean. Pairs that straddle a change of the
    machine's speed (single pairs from 0.6 to 1.2) are left out rather than averaged in.
    Returns (ratios, streams that had a measurement on either side)."""
    ratios, bracketed = [], 0
    for k, (kind, rate) in enumerate(sequence):
        if kind != "served":
            continue
        before = next((r for w, r in reversed(sequence[:k]) if w == "in"), None)
        after = next((r for w, r in sequence[k + 1:] if w == "in"), None)
        if before is None or after is None:
            continue
        bracketed += 1
        mean = (before + after) / 2
        if abs(before - after) <= STEADY * mean:
            ratios.append(rate / mean)
    return ratios, bracketed


def paired(args, model, env):
    """--pairs: each layout's deployment stays up while in-process measurements and served
    streams alternate beside it."""
    print(f"served async over in-process, {args.pairs} pairs per layout, each an in-process "
          f"measurement and a streamed 128-token completion taken back to back (alternating "
          f"which goes first), in-process at context {CONTEXT}")
    print(f"{'layout':<16} {'in-process':>10} {'served':>8} {'pairs: median [lowest, highest]':>32} "
          f"{'pairs >= 0.95':>14}")
    layouts = [(name, nodes) for name, nodes in (("co-located", 0), ("2 memory nodes", 2))
               if str(nodes) in args.memory_nodes.split(",")]
    for layout, nodes in layouts:
        extra = (["--data_plane=sm"] if nodes else []) + args.launcher_args.split()
        offload = None
        if nodes:
            offload = subprocess.Popen(
                [f"{args.bin_dir}/compute_node/bench/offload_bench", "--mode=breakdown",
                 f"--model={model}", "--batches=1", f"--ctx={CONTEXT}", "--iters=24",
                 "--warmup_steps=4", "--rounds_on_stdin",
                 f"--memory_node_bin={args.bin_dir}/memory_node/memory_node"],
                env=compare_builds.ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, cwd="/tmp")

        def in_process():
            if offload is None:
                return in_process_colocated(args.bin_dir, model, rounds=1)
            offload.stdin.write("round\n")
            offload.stdin.flush()
            line = offload.stdout.readline().split()
            if len(line) != 2 or line[0] != "offload_ms":
                raise RuntimeError(f"offload_bench stopped answering (exit code {offload.poll()})")
            return 1000.0 / float(line[1])

        try:
            while offload is not None:
                line = offload.stdout.readline()
                if line.strip() == "ready":
                    break
                if not line:
                    raise RuntimeError(f"offload_bench exited before it was ready "
                                       f"(exit code {offload.wait()})")
            with compare_builds.launch(args.bin_dir, nodes, extra, env=env) as (port, name, _):
                compare_builds.stream_tokens_per_second(port, name, 16)  # warm-up
                in_process()
                pairs = []
                sequence = []  # every measurement in the order taken: ("in" | "served", tok/s)
                for i in range(args.pairs):
                    pair = {}
                    for which in (("in", "served") if i % 2 == 0 else ("served", "in")):
                        pair[which] = (in_process() if which == "in" else
                                       compare_builds.stream_tokens_per_second(port, name, 128))
                        sequence.append((which, pair[which]))
                    pairs.append((pair["in"], pair["served"]))
                    print(f"pair {i + 1} {layout}: in-process {pair['in']:.2f}, served "
                          f"{pair['served']:.2f} tok/s", file=sys.stderr, flush=True)
        finally:
            if offload is not None:
                try:
                    offload.stdin.close()  # ends its rounds; it stops its memory nodes
                except BrokenPipeError:
                    pass
                try:
                    offload.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    offload.kill()
                    offload.wait()
        ratios = [s / i for i, s in pairs]
        cell = (f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, "
                f"{max(ratios):.3f}]")
        print(f"{layout:<16} {statistics.median(i for i, _ in pairs):>10.2f} "
              f"{statistics.median(s for _, s in pairs):>8.2f} {cell:>32} "
              f"{f'{sum(r >= 0.95 for r in ratios)} of {len(ratios)}':>14}", flush=True)
        steady, bracketed = steady_ratios(sequence)
        if steady:
            print(f"{'':<16} steady minutes: {len(steady)} of {bracketed} streams, served over "
                  f"the mean of the in-process figures on either side: "
                  f"{statistics.median(steady):.3f} [{min(steady):.3f}, {max(steady):.3f}], "
                  f"{sum(r >= 0.95 for r in steady)} at 0.95 or above", flush=True)
        else:
            print(f"{'':<16} steady minutes: none of {bracketed} streams", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=0,
                        help="instead of rounds: N tight pairs per layout (see above)")
    parser.add_argument("--llama_dir", default="",
                        help="a llama.cpp build directory: llama-server joins the rounds")
    parser.add_argument("--launcher_args", default="",
                        help="extra launcher flags for every served mode, space-separated "
                             "(e.g. --server_args=--plan_ahead_lead=1)")
    parser.add_argument("--memory_nodes", default="0,2",
                        help="with --pairs: the layouts to measure, by memory nodes (0: "
                             "co-located, 2: 2 memory nodes)")
    args = parser.parse_args()
    if args.memory_nodes != "0,2" and not args.pairs:
        parser.error("--memory_nodes chooses the layouts of --pairs; the rounds run both")
    model = compare_builds.demo_model()
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if args.pairs:
        paired(args, model, env)
        return
    waits = {}

    def served(memory_nodes, extra):
        def run():
            result = compare_builds.run_serve(args.bin_dir, memory_nodes=memory_nodes,
                                              extra_args=extra, env=env, plan_wait=True)
            waits.setdefault((memory_nodes, tuple(extra)), []).append(
                (result["plan wait ms"], result["plan waited steps"], result["node step ms"]))
            return result["serve single-stream decode tok/s"]
        return run

    sm = ["--data_plane=sm"]
    extra = args.launcher_args.split()
    synchronous = ["--async_scheduling=false"] + extra
    asynchronous = ["--async_scheduling"] + extra
    runs = {
        ("co-located", "in-process"): lambda: in_process_colocated(args.bin_dir, model),
        ("co-located", "served"): served(0, synchronous),
        ("co-located", "served async"): served(0, asynchronous),
        ("2 memory nodes", "in-process"): lambda: in_process_offloaded(args.bin_dir, model),
        ("2 memory nodes", "served"): served(2, sm + synchronous),
        ("2 memory nodes", "served async"): served(2, sm + asynchronous),
    }
    if args.llama_dir:
        # Only where llama.cpp joins: its GGUF export needs numpy (Debian's python3-numpy).
        import peer_bench  # noqa: E402
        gguf = peer_bench.gguf_of(model)

        def llama_served():
            with peer_bench.llama_server(args.llama_dir, gguf, 1) as (port, _, _):
                compare_builds.stream_tokens_per_second(port, None, 16)  # warm-up
                return statistics.median(
                    compare_builds.stream_tokens_per_second(port, None, 128) for _ in range(3))
        runs[("llama.cpp", "llama-server")] = llama_served
    rates = {}
    for r in range(args.rounds):
        keys = list(runs) if r % 2 == 0 else list(reversed(runs))
        for key in keys:
            rate = runs[key]()
            rates.setdefault(key, []).append(rate)
            print(f"round {r + 1} {key[0]} {key[1]}: {rate:.2f} tok/s", file=sys.stderr,
                  flush=True)
    print(f"single-stream decode tok/s, medians of {args.rounds} interleaved rounds, "
          f"in-process at context {CONTEXT}")
    print(f"{'layout':<16} {'in-process':>10} {'served':>8} {'served/in-process':>18} "
          f"{'async':>8} {'async/in-process':>17}")
    for layout in ("co-located", "2 memory nodes"):
        a = statistics.median(rates[(layout, "in-process")])
        b = statistics.median(rates[(layout, "served")])
        c = statistics.median(rates[(layout, "served async")])
        print(f"{layout:<16} {a:>10.2f} {b:>8.2f} {b / a:>18.3f} {c:>8.2f} {c / a:>17.3f}")
    # The machine drifts within minutes: a round's own served/in-process ratio pairs figures
    # taken a minute or two apart, and the median of those is steadier than the ratio of
    # medians above.
    print("\nthe same ratios round by round (each round's served over its own in-process "
          "rate): median [lowest, highest], and the rounds at 0.95 or above")
    print(f"{'layout':<16} {'served/in-process':>26} {'async/in-process':>26} {'async >= 0.95':>14}")
    for layout in ("co-located", "2 memory nodes"):
        ratios = {mode: [s / i for s, i in zip(rates[(layout, mode)],
                                               rates[(layout, "in-process")])]
                  for mode in ("served", "served async")}
        cells = [f"{statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]"
                 for r in ratios.values()]
        met = sum(r >= 0.95 for r in ratios["served async"])
        print(f"{layout:<16} {cells[0]:>26} {cells[1]:>26} {f'{met} of {args.rounds}':>14}")
    if args.llama_dir:
        peer = statistics.median(rates[("llama.cpp", "llama-server")])
        ours = statistics.median(rates[("co-located", "served async")])
        print(f"llama-server on the same weights, {peer_bench.THREADS} threads: {peer:.2f} tok/s; "
              f"strata co-located served async / llama-server: {ours / peer:.3f}")
    print("\ncompute node over the timed streams (medians of rounds): its mean wait for its "
          "next plan, ms; the share of its steps that waited; its own mean step, ms (waits "
          "excluded; the streams' prefill steps included), and the tokens/s that step alone "
          "would give, over the layout's in-process rate")
    print(f"{'layout':<16} {'mode':<7} {'wait ms':>8} {'waited':>7} {'step ms':>8} "
          f"{'step rate/in-process':>21}")
    for layout, nodes, extra in (("co-located", 0, []), ("2 memory nodes", 2, sm)):
        a = statistics.median(rates[(layout, "in-process")])
        for mode, flags in (("sync", synchronous), ("async", asynchronous)):
            w = [statistics.median(x) for x in zip(*waits[(nodes, tuple(extra + flags))])]
            print(f"{layout:<16} {mode:<7} {w[0]:>8.3f} {w[1]:>7.2f} {w[2]:>8.3f} "
                  f"{1000.0 / w[2] / a:>21.3f}")


if __name__ == "__main__":
    main()
