#!/usr/bin/python3
"""Time to the first token: streamed completions of a 64-token prompt (16 tokens, greedy;
--prompt_tokens for another length), one at a time with a pause between them, so that each
arrives at an idle deployment, as a chat turn does. Every prompt starts with a token of its
own, so that no engine finds any of it in its prefix cache: each request prefills all of it. For each request: the time
from sending it to its first token event, and from the first token to the second; medians
over the requests of a launch, then over the launches of a configuration.

Each --launcher_args entry is one configuration of the embedded default (deploy/local
launcher; --memory_nodes as given), run on each --bin_dir given; launches alternate between
configurations, --rounds times each. With --llama_dir (a llama.cpp build directory, built
outside the repository), llama-server serves the same weights (in GGUF, export_gguf.py)
with as many threads, in the same rotation.

  /usr/bin/python3 tests/bench/ttft_bench.py --bin_dir="$(bazel info bazel-bin)" \\
      [--launcher_args="" --launcher_args="--async_scheduling=false"] [--rounds=3] \\
      [--requests=8] [--memory_nodes=0] [--prompt_tokens=64] [--llama_dir=DIR]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_builds  # noqa: E402
import peer_bench  # noqa: E402

PAUSE_SECONDS = 0.05
MAX_TOKENS = 16


def prompt_ids(n, tokens):
    """Prompt `n` of `tokens` token ids (the same for every engine: no tokenizer
    differences). Its first token is its own, so it shares no prefix with any other."""
    return [6000 + n] + [100 + (i * 37) % 5000 for i in range(1, tokens)]


def timings(port, model, requests, tokens):
    """[(ms to the first token, ms from the first to the second)] of `requests` streamed
    completions of `tokens`-token prompts, PAUSE_SECONDS apart, after one to warm up, each
    with a prompt of its own."""
    def body(n):
        return {"model": model, "prompt": prompt_ids(n, tokens), "max_tokens": MAX_TOKENS,
                "temperature": 0, "ignore_eos": True, "stream": True}
    compare_builds.stream_event_times(port, body(0))
    out = []
    for n in range(1, requests + 1):
        time.sleep(PAUSE_SECONDS)
        sent = time.monotonic()
        times = compare_builds.stream_event_times(port, body(n))
        if len(times) < 2:
            raise RuntimeError(f"only {len(times)} events")
        out.append((1000.0 * (times[0] - sent), 1000.0 * (times[1] - times[0])))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin_dir", action="append", required=True,
                        help="a build (repeatable: each configuration runs on each)")
    parser.add_argument("--launcher_args", action="append",
                        help="a configuration: launcher flags, space-separated (repeatable)")
    parser.add_argument("--memory_nodes", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--llama_dir", default="")
    parser.add_argument("--prompt_tokens", type=int, default=64)
    args = parser.parse_args()
    if args.rounds < 1 or args.requests < 1:
        parser.error("--rounds and --requests must be at least 1")
    if not 2 <= args.prompt_tokens <= 4000:
        parser.error("--prompt_tokens must be between 2 and 4000 (the demo model's context "
                     "is 4096)")
    if len(set(args.launcher_args or [""])) != len(args.launcher_args or [""]):
        parser.error("each --launcher_args must differ from the others")
    model = compare_builds.demo_model()
    configs = compare_builds.configurations(args.bin_dir, args.launcher_args)
    if args.llama_dir:
        configs.append(("llama-server", None, None))
        gguf = peer_bench.gguf_of(model)
    else:
        print("no --llama_dir: llama-server skipped")
    results = {c[0]: [] for c in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else list(reversed(configs))
        for label, bin_dir, launcher_args in order:
            if bin_dir is None:
                context = args.prompt_tokens + MAX_TOKENS + 16
                with peer_bench.llama_server(args.llama_dir, gguf, 1, context) as (port, _, _):
                    got = timings(port, "demo", args.requests, args.prompt_tokens)
            else:
                with compare_builds.launch(bin_dir, args.memory_nodes,
                                           (launcher_args or "").split()) as (port, name, _):
                    got = timings(port, name, args.requests, args.prompt_tokens)
            first = statistics.median(t for t, _ in got)
            second = statistics.median(t for _, t in got)
            results[label].append((first, second))
            print(f"round {r + 1} [{label}]: first token {first:.2f} ms, first to second "
                  f"{second:.2f} ms (medians of {len(got)})", flush=True)
    print(f"{args.prompt_tokens}-token prompt, {MAX_TOKENS} tokens, {args.requests} requests per launch "
          f"{int(PAUSE_SECONDS * 1000)} ms apart, {args.memory_nodes} memory node(s); medians of "
          f"{args.rounds} launches")
    print(f"{'configuration':48s} {'first token ms':>15s} {'first to second ms':>19s}")
    for label, _, _ in configs:
        first = statistics.median(f for f, _ in results[label])
        second = statistics.median(s for _, s in results[label])
        print(f"{label:48.48s} {first:15.2f} {second:19.2f}")


if __name__ == "__main__":
    main()
