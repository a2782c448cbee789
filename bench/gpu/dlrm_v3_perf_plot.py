#!/usr/bin/env python3
"""The plot of a dlrm_v3_perf.py run: served queries a second and p99 latency by client count,
one line per GPU cache share (solid: the script's own clients; dashed: perf_analyzer, by its
concurrency), with the compiled reference's best as a level beside them, from the lines the run
printed (its dlrm_v3_perf.txt).

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
REFERENCE = re.compile(r"reference, torch.compile \(padded\), batch (\d+):\s+([0-9.]+) queries/s")


def read(path):
    """({share: [(clients, queries/s, p99 ms)]}, {batch: queries/s}) from a run's lines; the
    perf_analyzer lines under the share "<share> perf_analyzer"."""
    served, reference = defaultdict(list), {}
    with open(path) as f:
        for line in f:
            if m := SERVED.search(line):
                served[m[1]].append((int(m[2]), float(m[3]), float(m[5])))
            elif m := ANALYZER.search(line.rstrip()):
                served[f"{m[1]} perf_analyzer"].append((int(m[2]), float(m[3]), float(m[4])))
            elif m := REFERENCE.search(line):
                reference[int(m[1])] = float(m[2])
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
    fig, (rate, p99) = plt.subplots(1, 2, figsize=(11, 4.2))
    for share, points in sorted(served.items()):
        points.sort()
        value, fresh, pa = float(share.split()[0]), "fresh" in share, "perf_analyzer" in share
        label = "every row in HBM" if value >= 1 else f"GPU cache of {value:.0%} of the rows"
        label += ", fresh users" if fresh else ", endless stream" if "stream" in share else ""
        label += ", perf_analyzer" if pa else ""
        style = "s--" if pa else "o-"
        rate.plot([c for c, _, _ in points], [q for _, q, _ in points], style, label=label)
        p99.plot([c for c, _, _ in points], [t for _, _, t in points], style, label=label)
    if reference:
        batch, best = max(reference.items(), key=lambda kv: kv[1])
        rate.axhline(best, color="gray", ls="--", label=f"reference, torch.compile (best: batch {batch})")
    p99.axhline(80, color="red", ls=":", label="MLPerf's p99 bound (80 ms)")
    rate.set(xlabel="clients (a request in flight each)", ylabel="queries (users) a second", title="throughput")
    p99.set(xlabel="clients (a request in flight each)", ylabel="p99 latency, ms", title="latency")
    for ax in (rate, p99):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(a.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)


if __name__ == "__main__":
    main()
