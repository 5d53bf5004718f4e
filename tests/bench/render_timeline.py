#!/usr/bin/python3
"""Renders the nodes' timelines (Chrome trace JSON from --trace_file, or the launcher's
--trace_dir) as one PNG: a row per compute-node lane and per memory-node connection, a bar
per stage, coloured by the step's batch, over a window of a few steps.

  /usr/bin/python3 tests/bench/render_timeline.py --out=timeline.png \
      [--window_ms=150] [--skip_ms=1000] TRACE.json [TRACE.json ...]

The window starts --skip_ms after the first compute stage (past the prefill) and lasts
--window_ms. Compute bars are named "step S L" (projections, FFN, next layer's q/k/v for
step S), "wait L" (waiting for layer L's attention) or "step S begin"/"sample"; memory bars
"step S L mbJ" (attention of layer L, mini-batch J). A step's colour is that of the compute lane
that runs it (under rotational pipelining, of its batch slot's lane on every node), so a
memory bar shares the colour of the lane whose step it serves. Rotated compute bars are
named "step S slice K".
"""
import argparse
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STEP = re.compile(r"step (\d+)")


def load(paths):
    rows = {}  # (process, track) -> [(start_us, dur_us, name)]
    for path in paths:
        data = json.load(open(path))
        process = {}
        tracks = {}
        for e in data["traceEvents"]:
            if e["ph"] == "M" and e["name"] == "process_name":
                process[e["pid"]] = e["args"]["name"]
            elif e["ph"] == "M" and e["name"] == "thread_name":
                tracks[(e["pid"], e["tid"])] = e["args"]["name"]
        for e in data["traceEvents"]:
            if e["ph"] != "X":
                continue
            name = process.get(e["pid"], str(e["pid"]))
            track = tracks.get((e["pid"], e["tid"]), f"conn {e['tid']}")
            rows.setdefault((name, track), []).append((e["ts"], e["dur"], e["name"]))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--window_ms", type=float, default=150)
    parser.add_argument("--skip_ms", type=float, default=1000)
    parser.add_argument("--title", default="Two batches in flight: compute-node lanes and "
                        "memory-node attention")
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args()
    rows = load(args.traces)
    compute = [e for (p, _), es in rows.items() if p.startswith("compute") for e in es]
    if not compute:
        sys.exit("no compute-node events in the traces")
    # Which lane of which compute node runs which step: colour memory bars by that lane.
    # Under rotational pipelining a step runs on every compute node, on the lane of its
    # batch slot: steps are then coloured by that slot alone.
    lane_of_step = {}
    nodes_of_step = {}
    for (p, track), events in rows.items():
        if p.startswith("compute"):
            for _, _, name in events:
                m = STEP.match(name)
                if m:
                    lane_of_step[int(m.group(1))] = (p, track)
                    nodes_of_step.setdefault(int(m.group(1)), set()).add(p)
    if any(len(nodes) > 1 for nodes in nodes_of_step.values()):
        lane_of_step = {step: ("every node's", track) for step, (_, track) in lane_of_step.items()}
    lanes = sorted({t for t in lane_of_step.values()})
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    colour_of_lane = {lane: palette[i % len(palette)] for i, lane in enumerate(lanes)}

    start = min(ts for ts, _, _ in compute) + args.skip_ms * 1000
    end = start + args.window_ms * 1000
    order = sorted(rows, key=lambda k: (not k[0].startswith("compute"), k[0], k[1]))
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(order) + 1.5))
    for y, key in enumerate(order):
        for ts, dur, name in rows[key]:
            if ts + dur < start or ts > end:
                continue
            m = STEP.match(name)
            colour = "lightgrey"
            if m and int(m.group(1)) in lane_of_step:
                colour = colour_of_lane[lane_of_step[int(m.group(1))]]
            ax.barh(y, dur / 1000, left=(ts - start) / 1000, height=0.6, color=colour,
                    edgecolor="black", linewidth=0.2)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"{p} {t}" for p, t in order])
    ax.invert_yaxis()
    ax.set_xlim(0, args.window_ms)
    ax.set_xlabel("ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour_of_lane[lane]) for lane in lanes]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="lightgrey"))
    ax.legend(handles, [f"steps of {lane[0]} {lane[1]}" for lane in lanes] + ["waiting"], loc="upper right",
              fontsize=8)
    ax.set_title(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
