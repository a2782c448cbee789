#!/usr/bin/env python3
"""The AOTInductor report (docs/perf/h100/aoti/) from committed GPU results.

Dense models (`run.sh aoti MODEL`, results folders holding report.md): their tables as
aoti_perf.py wrote them, and one plot per model of inferences/s per batch — TorchScript
served, bare TorchScript CUDA graph, AOTInductor served, bare AOTInductor (C++ runner).
Recommenders as one model (`run.sh aoti-recsys`, results folders holding console.log): a
table of each served figure beside the package's network alone and the target, and a plot.

    python bench/gpu/aoti_report.py --dense DIR... --recsys DIR... --out DIR [--no-plots]
"""
from __future__ import annotations

import argparse
import os
import re

# the targets for the one-model recommenders (inferences/s, by model and batch)
RECSYS_TARGETS = {("dlrm", 4096): 10e6, ("dlrm", 65536): 30e6, ("dcnv2", 65536): 11e6, ("wide_deep", 131072): 35e6}


def dense_tables(folder):
    """The report.md of one `run.sh aoti` results folder: (title, its lines, its rows as dicts)."""
    with open(os.path.join(folder, "report.md")) as f:
        lines = f.read().splitlines()
    title = lines[0].lstrip("# ").strip()
    header = next(i for i, line in enumerate(lines) if line.startswith("| served"))
    cols = [c.strip() for c in lines[header].strip("|").split("|")]
    rows = []
    for line in lines[header + 2:]:
        if not line.startswith("| "):
            break
        rows.append(dict(zip(cols, [c.strip() for c in line.strip("|").split("|")])))
    return title, lines, rows


RECSYS_LINE = re.compile(r"^\s+(\w+?)_one\s+a=([\d.]+)\s+b=(\d+)\s+c=(\d+)\s+([\d.]+) M inf/s\s+p99\s+([\d.]+) ms\s+hit rate ([\d.]+)")
NETWORK_LINE = re.compile(r"bare AOTI network batch (\d+): plain ([\d.]+) ms \(([\d.]+) M/s\), CUDA graph ([\d.]+) ms \(([\d.]+) M/s\)")
PER_EXEC = re.compile(r"per execution \(ms\): \w+: input ([\d.]+), infer ([\d.]+), output ([\d.]+), queue ([\d.]+)")


def recsys_rows(folder):
    """Each served figure of one `run.sh aoti-recsys` console, with the network alone at that batch."""
    rows, network, model = [], {}, None
    with open(os.path.join(folder, "console.log")) as f:
        for line in f:
            m = re.search(r"exported (\w+)'s network", line)
            if m:
                model = m.group(1)
            n = NETWORK_LINE.search(line)
            if n and model:
                network[(model, int(n.group(1)))] = max(float(n.group(3)), float(n.group(5))) * 1e6
            r = RECSYS_LINE.match(line)
            if r:
                rows.append({"model": r.group(1), "alpha": r.group(2), "batch": int(r.group(3)), "conc": int(r.group(4)),
                             "ips": float(r.group(5)) * 1e6, "p99": float(r.group(6)), "hit": r.group(7)})
            e = PER_EXEC.search(line)
            if e and rows:
                rows[-1]["infer_ms"] = float(e.group(2))
    for r in rows:
        r["network"] = network.get((r["model"], r["batch"]))
        r["target"] = RECSYS_TARGETS.get((r["model"], r["batch"]))
    return rows


def plot_dense(title, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = [r["batch"] for r in rows if r["served"] == "AOTI" and " " not in r["batch"]]
    series = {"TorchScript served": [], "bare TorchScript CUDA graph": [], "AOTInductor served": [],
              "bare AOTInductor CUDA graph (C++)": []}
    for b in batches:
        aoti = next(r for r in rows if r["served"] == "AOTI" and r["batch"] == b)
        ts = next((r for r in rows if r["served"] == "TorchScript" and r["batch"] == b), None)
        series["TorchScript served"].append(float(ts["Inferences/Second"]) if ts else 0)
        series["bare TorchScript CUDA graph"].append(float(aoti["bare TS graph/s"]))
        series["AOTInductor served"].append(float(aoti["Inferences/Second"]))
        series["bare AOTInductor CUDA graph (C++)"].append(float(aoti["bare AOTI graph/s"]))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.2
    colors = ["#9ecae1", "#3182bd", "#fdae6b", "#e6550d"]
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - 1.5) * width for j in range(len(batches))]
        ax.bar(xs, values, width, label=name, color=colors[i])
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_ylabel("inferences/s")
    ax.set_title(title.split(":")[0] + ": served (perf_analyzer) and bare")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_recsys(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['model']}\nbatch {r['batch']}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["ips"] / 1e6 for r in rows], 0.4, label="served as one model", color="#e6550d")
    ax.bar([x + 0.2 for x in xs], [(r["network"] or 0) / 1e6 for r in rows], 0.4,
           label="the package's network alone (no lookup)", color="#fdae6b")
    for x, r in zip(xs, rows):
        if r["target"]:
            ax.plot([x - 0.4, x + 0.4], [r["target"] / 1e6] * 2, color="black", linewidth=2,
                    label="target" if x == next(i for i, q in enumerate(rows) if q["target"]) else None)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("M inferences/s")
    ax.set_title("Recommenders at Criteo scale, AOTInductor network, one model")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dense", nargs="*", default=[])
    p.add_argument("--recsys", nargs="*", default=[])
    p.add_argument("--out", required=True)
    p.add_argument("--no-plots", action="store_true")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    md = ["# PyTorch 2 (AOTInductor) packages on an H100", "",
          "Made by `bash bench/gpu/make_reports.sh` from `bench/gpu/results/aoti_h100/`; the commands are in",
          "[docs/performance.md](../../../performance.md#pytorch-2-aotinductor-packages).", ""]
    for folder in a.dense:
        title, lines, rows = dense_tables(folder)
        md += ["## " + title, ""] + lines[1:] + [""]
        name = os.path.basename(os.path.normpath(folder))
        if not a.no_plots:
            plot_dense(title, rows, os.path.join(a.out, f"{name}.png"))
        md += [f"![{name}]({name}.png)", ""]
    rows = [r for folder in a.recsys for r in recsys_rows(folder)]
    if rows:
        md += ["## Recommenders at Criteo scale as one model, network an AOTInductor package", "",
               "20.9 B parameters, 10% GPU cache, Zipf alpha 1.2, keys in CUDA shared memory, perf_analyzer gRPC, "
               "concurrency 1. Network alone: the package in the C++ runner (better of plain and CUDA graph).", "",
               "| model | batch | served inf/s | p99 ms | hit rate | server compute infer ms | network alone inf/s | served / network | target | |",
               "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            net = r["network"]
            tgt = r["target"]
            md.append(f"| {r['model']} | {r['batch']} | {r['ips'] / 1e6:.2f} M | {r['p99']:.2f} | {r['hit']} | "
                      f"{r.get('infer_ms', float('nan')):.2f} | {net / 1e6:.2f} M | {r['ips'] / net:.2f} | "
                      f"{'%.0f M' % (tgt / 1e6) if tgt else '-'} | {('MISS' if r['ips'] < tgt else 'PASS') if tgt else ''} |")
        md.append("")
        if not a.no_plots:
            plot_recsys(rows, os.path.join(a.out, "recommenders.png"))
        md += ["![recommenders](recommenders.png)", ""]
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
