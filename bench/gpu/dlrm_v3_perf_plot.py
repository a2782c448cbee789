#!/usr/bin/env python3
"""The plot of a dlrm_v3_perf.py run, from the lines it printed (its dlrm_v3_perf.txt): served
queries a second and p99 latency at each load's highest client count (perf_analyzer's concurrency;
the script's own clients on repeating users; fresh users; the endless stream), a bar per GPU cache
share, with the compiled and eager references' best as levels beside them.

    python3 bench/gpu/dlrm_v3_perf_plot.py RESULTS/dlrm_v3_perf.txt OUT.png [--title TEXT]
"""
import argparse
import re
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERVED = re.compile(r"served, cache ([0-9.]+(?: \((?:fresh users|stream)\))?),\s+(\d+) clients:\s+([0-9.]+) queries/s\s+p50\s+([0-9.]+)\s+p99\s+([0-9.]+) ms")
ANALYZER = re.compile(r"perf_analyzer, cache ([0-9.]+), concurrency (\d+):\s+([0-9.]+) queries/s;.*p99 ([0-9.]+)$")
REFERENCE = re.compile(r"reference, (torch.compile|eager) \(padded\), batch (\d+):\s+([0-9.]+) queries/s")
LOADS = ("perf_analyzer", "repeating users", "fresh users", "stream")
LOAD_NAMES = {"perf_analyzer": "perf_analyzer\n(32 users repeating)", "repeating users": "our clients,\n32 users repeating",
              "fresh users": "our clients,\nfresh users", "stream": "our clients,\nendless stream"}


def read(path):
    """({(load, share): (clients, queries/s, p99 ms)} at each load's highest client count,
    {kind: (batch, queries/s)}: each reference's best) from a run's lines."""
    served, reference = {}, {}
    with open(path) as f:
        for line in f:
            if m := SERVED.search(line):
                share, _, kind = m[1].partition(" (")
                key = (kind.rstrip(")") or "repeating users", share)
                point = (int(m[2]), float(m[3]), float(m[5]))
            elif m := ANALYZER.search(line.rstrip()):
                key, point = ("perf_analyzer", m[1]), (int(m[2]), float(m[3]), float(m[4]))
            elif m := REFERENCE.search(line):
                if float(m[3]) > reference.get(m[1], (0, 0.0))[1]:
                    reference[m[1]] = (int(m[2]), float(m[3]))
                continue
            else:
                continue
            if point[0] >= served.get(key, (0,))[0]:
                served[key] = point
    return served, reference


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lines")
    p.add_argument("png")
    p.add_argument("--title", default="DLRM-v3 served through tritonserver")
    a = p.parse_args()
    served, reference = read(a.lines)
    if not served:
        raise SystemExit(f"{a.lines}: no served lines")
    fig, (rate, p99) = plt.subplots(1, 2, figsize=(12, 4.6))
    loads = [x for x in LOADS if any(k == x for k, _ in served)]
    shares = sorted({s for _, s in served}, key=float)
    width = 0.8 / len(shares)
    for i, share in enumerate(shares):
        value = float(share)
        label = "every row in HBM" if value >= 1 else f"GPU cache of {value:.0%} of the item rows"
        at = [j + (i - (len(shares) - 1) / 2) * width for j in range(len(loads))]
        points = [served.get((load, share)) for load in loads]
        for ax, col in ((rate, 1), (p99, 2)):
            bars = ax.bar(at, [p[col] if p else 0 for p in points], width, label=label)
            ax.bar_label(bars, labels=[f"{p[col]:.0f}" if p else "" for p in points], fontsize=7)
    for kind, style in (("torch.compile", "--"), ("eager", ":")):
        if kind in reference:
            batch, best = reference[kind]
            rate.axhline(best, color="gray", ls=style, label=f"reference, {kind} (best: batch {batch})")
    p99.axhline(80, color="red", ls=":", label="MLPerf's p99 bound (80 ms)")
    counts = sorted({p[0] for p in served.values()})
    rate.set(ylabel="queries (users) a second", title=f"throughput ({'/'.join(map(str, counts))} in flight)")
    p99.set(ylabel="p99 latency, ms", title="latency")
    for ax in (rate, p99):
        ax.set_xticks(range(len(loads)), [LOAD_NAMES[x] for x in loads], fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.suptitle(a.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)


if __name__ == "__main__":
    main()
