"""Plots a strata deployment's own metrics over a benchmark run: the stand-in for a Grafana
screenshot (no Grafana here). Samples the server's /metrics every --interval seconds until
--duration, then draws the overview dashboard's main panels, computed as its PromQL does
(rates and histogram quantiles over the sampling window), and the offloading view's round
trip and bytes from the compute node.

  /usr/bin/python3 tests/bench/plot_dashboard.py --server PORT --compute PORT \
      --duration 60 --out docs/dashboard.png
"""
import argparse
import re
import time
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def total(sample, name, **labels):
    s = 0.0
    for k, v in sample.items():
        if k == name or k.startswith(name + "{"):
            if all(f'{lk}="{lv}"' in k for lk, lv in labels.items()):
                s += v
    return s


def quantile(prev, cur, name, q):
    buckets = []
    for k, v in cur.items():
        if k.startswith(name + "_bucket{"):
            le = re.search(r'le="([^"]+)"', k).group(1)
            buckets.append((float("inf") if le == "+Inf" else float(le), v - prev.get(k, 0.0)))
    buckets.sort()
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, last_le, last_c = q * buckets[-1][1], 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return last_le
            return last_le + (le - last_le) * (rank - last_c) / max(c - last_c, 1e-12)
        last_le, last_c = le, c
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", type=int, required=True)
    ap.add_argument("--compute", type=int, default=0)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--interval", type=float, default=2)
    ap.add_argument("--window", type=int, default=5, help="samples per rate/quantile window")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="strata (metrics from a serve_bench run)")
    a = ap.parse_args()
    samples, t0 = [], time.time()
    while time.time() - t0 < a.duration:
        s = scrape(a.server)
        if a.compute:
            s.update({"compute/" + k: v for k, v in scrape(a.compute).items()})
        samples.append((time.time() - t0, s))
        time.sleep(a.interval)
    w = a.window
    xs, series = [], {k: [] for k in ("gen", "req", "ttft50", "ttft99", "itl50", "itl99", "run",
                                       "wait", "kv", "rtt50", "rtt99", "mbps")}
    for i in range(w, len(samples)):
        (tp, p), (tc, c) = samples[i - w], samples[i]
        dt = tc - tp
        xs.append(tc)
        series["gen"].append((total(c, "strata_generation_tokens_total") - total(p, "strata_generation_tokens_total")) / dt)
        series["req"].append((total(c, "strata_request_success_total") - total(p, "strata_request_success_total")) / dt)
        for q, key in ((0.5, "50"), (0.99, "99")):
            series["ttft" + key].append(quantile(p, c, "strata_time_to_first_token_seconds", q))
            series["itl" + key].append(quantile(p, c, "strata_inter_token_latency_seconds", q))
            series["rtt" + key].append(quantile(p, c, "compute/strata_attention_round_trip_seconds", q))
        series["run"].append(total(c, "strata_num_requests_running"))
        series["wait"].append(total(c, "strata_num_requests_waiting"))
        series["kv"].append(100 * total(c, "strata_kv_cache_usage_perc"))
        series["mbps"].append((total(c, "compute/strata_data_plane_bytes_total") - total(p, "compute/strata_data_plane_bytes_total")) / dt / 1e6)

    def ms(v):
        return [None if x is None else 1e3 * x for x in v]

    fig, ax = plt.subplots(2, 3, figsize=(15, 7.5))
    fig.suptitle(a.title)
    panels = [
        (ax[0][0], "Throughput", [("generated tok/s", series["gen"]), ("requests/s ×50", [50 * x for x in series["req"]])], ""),
        (ax[0][1], "Time to first token", [("p50", ms(series["ttft50"])), ("p99", ms(series["ttft99"]))], "ms"),
        (ax[0][2], "Inter-token latency", [("p50", ms(series["itl50"])), ("p99", ms(series["itl99"]))], "ms"),
        (ax[1][0], "Queue and KV", [("running", series["run"]), ("waiting", series["wait"]), ("KV used %", series["kv"])], ""),
        (ax[1][1], "Attention round trip per layer", [("p50", ms(series["rtt50"])), ("p99", ms(series["rtt99"]))], "ms"),
        (ax[1][2], "Data plane (compute node)", [("MB/s both ways", series["mbps"])], "MB/s"),
    ]
    for axis, title, lines, unit in panels:
        for label, ys in lines:
            axis.plot(xs, [float("nan") if y is None else y for y in ys], label=label)
        axis.set_title(title)
        axis.set_xlabel("s")
        if unit:
            axis.set_ylabel(unit)
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=80)
    print(f"wrote {a.out} from {len(samples)} scrapes")


if __name__ == "__main__":
    main()
