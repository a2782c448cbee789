#!/usr/bin/env python3
"""Seed-style performance report from perf_analyzer's CSV files (issue 9).

Reads a folder written by bench/gpu/dense_perf.py (`<model>_<mode>_b<batch>_c<conc>[_cudashm][_http].csv`
and `refs.json`, the bare-engine figures of the same run), or a results folder of `run.sh dense`
that keeps them in its `perf.tgz`, and writes, into --out:

- `report.md`: per model, the offline table (client batch sweep at concurrency 1) and the
  online table (concurrency sweep, requests of batch 1) in the columns of NVIDIA's
  DeepLearningExamples Triton reports (Inferences/Second, Client Send, Network+Server
  Send/Recv, Server Queue, Server Compute Input/Infer/Output, Client Recv, p50/p90/p95/p99,
  Avg latency), with the bare engine's figure at the same batch and the ratio;
- PNG plots: throughput vs batch (served and bare), latency vs batch, the latency breakdown
  per batch, and online throughput and latency vs concurrency with its breakdown.

    python3 bench/gpu/report.py --perf bench/gpu/results/dense/resnet50 [more folders] --out docs/perf/h100/dense
"""
import argparse
import atexit
import csv
import glob
import json
import os
import re
import shutil
import tarfile
import tempfile
import textwrap

PARTS = ["Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
         "Server Compute Infer", "Server Compute Output", "Client Recv"]
PCTS = ["p50 latency", "p90 latency", "p95 latency", "p99 latency"]
NAME = re.compile(r"^(?P<base>[a-z0-9_]+?)_(?P<mode>eager|graphs|online)_b(?P<batch>\d+)_c(?P<conc>\d+)(?P<cuda>_cudashm)?(?P<http>_http)?\.csv$")


def unpacked(folder, archive, inner):
    """Where a results folder's files are: run.sh packs a benchmark's files into one archive
    (`perf.tgz` holding `perf/`, `recsys.tgz` holding `recsys/`) beside its console; such an
    archive is unpacked into a temporary folder that goes when the program ends."""
    path = os.path.join(folder, archive)
    if not os.path.exists(path):
        return folder
    tmp = tempfile.mkdtemp(prefix="report_")
    atexit.register(shutil.rmtree, tmp, True)
    with tarfile.open(path) as tar:
        tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return os.path.join(tmp, inner)


def read(folder):
    """{base: [(mode, batch, conc, shm, row)]} with latencies in ms."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.csv"))):
        m = NAME.match(os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            r = {k: float(v) for k, v in row.items() if v not in ("", None)}
            for k in PARTS + PCTS:
                r[k] /= 1e3
            # perf_analyzer's CSV has no average column: the average is the sum of its parts
            r["Avg latency"] = sum(r[k] for k in PARTS)
            # perf_analyzer over HTTP: its own mode label (rows and plot lines beside gRPC's)
            mode = m["mode"] + (" HTTP" if m["http"] else "")
            runs.setdefault(m["base"], []).append(
                (mode, int(m["batch"]), int(r.get("Concurrency", m["conc"])), "cuda" if m["cuda"] else "system", r))
    return runs


def bare_best(ref):
    return ref["graph_ips"] or ref["eager_ips"]


def table(rows, key_label, key, refs=None, ref_key=None):
    cols = [key_label, "mode", "Inferences/Second", *PARTS, "p50", "p90", "p95", "p99", "Avg latency"]
    if refs is not None:
        cols += ["bare eager/s", "bare graph/s", "served/bare"]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
    for mode, batch, conc, shm, r in rows:
        cells = [str(key(batch, conc)), mode + (" (CUDA shm)" if shm == "cuda" else ""), f"{r['Inferences/Second']:,.0f}"]
        cells += [f"{r[k]:.3f}" for k in PARTS + PCTS] + [f"{r['Avg latency']:.3f}"]
        if refs is not None:
            ref = refs[str(ref_key(batch, conc))]
            g = f"{ref['graph_ips']:,.0f}" if ref["graph_ips"] else "-"
            cells += [f"{ref['eager_ips']:,.0f}", g, f"{r['Inferences/Second'] / bare_best(ref):.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def plots(base, label, gpu, offline, online, bare, out, plt, engine="torch"):
    files = []
    colors = {"eager": "tab:blue", "graphs": "tab:orange", "online": "tab:green"}
    if offline:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        batches = sorted({b for _, b, _, shm, _ in offline if shm == "system"})
        for mode in sorted({m for m, *_ in offline}):
            pts = sorted((b, r) for m, b, _, shm, r in offline if m == mode and shm == "system")
            ax1.plot([b for b, _ in pts], [r["Inferences/Second"] for _, r in pts], "o-", color=colors.get(mode), label=f"served, {mode}")
            ax2.plot([b for b, _ in pts], [r["Avg latency"] for _, r in pts], "o-", color=colors.get(mode), label=f"served {mode}, avg")
            ax2.plot([b for b, _ in pts], [r["p99 latency"] for _, r in pts], "x--", color=colors.get(mode), label=f"served {mode}, p99")
        for kind, style in (("eager", ":"), ("graph", "-.")):
            pts = [(b, bare[str(b)][f"{kind}_ips"]) for b in batches if str(b) in bare and bare[str(b)][f"{kind}_ips"]]
            if pts:
                ax1.plot([b for b, _ in pts], [v for _, v in pts], style, color="gray", label=f"bare {'ONNX Runtime' if engine == 'onnx' else 'torch'}, {kind}")
        ax1.set(xscale="log", xlabel="client batch size", ylabel="inferences / second", title=f"{label}: throughput (concurrency 1)")
        ax2.set(xscale="log", xlabel="client batch size", ylabel="ms", title=f"{label}: latency (concurrency 1)")
        for ax in (ax1, ax2):
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        files.append(save(plt, fig, gpu, out, f"{base}_offline.png"))
        files.append(breakdown(plt, [(str(b), r) for m, b, _, shm, r in sorted(offline, key=lambda x: x[1])
                                     if shm == "system" and m == ("graphs" if any(x[0] == "graphs" for x in offline) else "eager")],
                               "client batch size", f"{label}: where a request's time goes (offline)", gpu, out, f"{base}_offline_breakdown.png"))
    if online:
        fig, ax1 = plt.subplots(figsize=(7, 4.5))
        pts = sorted((c, r) for _, _, c, _, r in online)
        ax1.plot([c for c, _ in pts], [r["Inferences/Second"] for _, r in pts], "o-", color="tab:green", label="inferences/s")
        ax1.set(xscale="log", xlabel="concurrent client requests", ylabel="inferences / second", title=f"{label}: online (batch 1 requests)")
        ax1.set_xticks([c for c, _ in pts], [str(c) for c, _ in pts])
        ax2 = ax1.twinx()
        ax2.plot([c for c, _ in pts], [r["p99 latency"] for _, r in pts], "x--", color="tab:red", label="p99 ms")
        ax2.plot([c for c, _ in pts], [r["Avg latency"] for _, r in pts], "s:", color="tab:purple", label="avg ms")
        ax2.set(ylabel="ms (log)", yscale="log")  # latencies span decades from concurrency 1 to 256
        lines = ax1.get_legend_handles_labels()
        more = ax2.get_legend_handles_labels()
        ax1.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
        ax1.grid(alpha=0.3)
        files.append(save(plt, fig, gpu, out, f"{base}_online.png"))
        files.append(breakdown(plt, [(str(c), r) for c, r in pts], "concurrent client requests",
                               f"{label}: where a request's time goes (online)", gpu, out, f"{base}_online_breakdown.png"))
    return files


def breakdown(plt, bars, xlabel, title, gpu, out, name):
    """Stacked shares of each latency part (batches differ by 10x in time, so shares
    read better than milliseconds); the average in ms over each bar."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    totals = [sum(r[p] for p in PARTS) for _, r in bars]
    bottom = [0.0] * len(bars)
    for part in PARTS:
        vals = [100 * r[part] / t for (_, r), t in zip(bars, totals)]
        ax.bar([x for x, _ in bars], vals, bottom=bottom, label=part)
        bottom = [a + b for a, b in zip(bottom, vals)]
    for x, t in zip([x for x, _ in bars], totals):
        ax.annotate(f"{t:.2f} ms", (x, 100), ha="center", va="bottom", fontsize=8)
    ax.set(xlabel=xlabel, ylabel="% of the average latency", title=title, ylim=(0, 112))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return save(plt, fig, gpu, out, name)


def save(plt, fig, gpu, out, name):
    """Titles the figure with the GPU, writes out/name and returns name."""
    # about 14 characters of 9-point text per inch: a long caption wraps instead of being cut
    fig.suptitle(textwrap.fill(gpu, int(fig.get_figwidth() * 14)), fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--perf", required=True, nargs="+",
                   help="folders with perf_analyzer's CSV files and refs.json, or results folders holding them in "
                        "perf.tgz (one per dense_perf.py run; models are merged)")
    p.add_argument("--out", required=True)
    p.add_argument("--no-plots", action="store_true")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    refs, runs = None, {}
    for folder in a.perf:
        folder = unpacked(folder, "perf.tgz", "perf")
        with open(os.path.join(folder, "refs.json")) as f:
            r = json.load(f)
        if refs is None:
            refs = r
        elif r["gpu"] != refs["gpu"]:
            raise SystemExit(f"{folder} comes from {r['gpu']}, not {refs['gpu']}: compare one GPU at a time")
        else:
            refs["models"].update(r["models"])
        runs.update(read(folder))
    plt = None
    if not a.no_plots:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    gpu = f"{refs['gpu']}; torch {refs['torch']}; perf_analyzer gRPC (HTTP where marked), system shared memory unless marked"
    md = [f"# Served vs bare engine — {refs['gpu'].split(',')[0]}", "",
          f"{gpu}. Latencies in ms; `served/bare` is served inferences/s over the bare engine's best "
          "(CUDA graph where one can be captured, else eager) at the same batch; online rows compare with the bare engine at batch 64 (or the model's largest batch below it).", ""]
    for base, info in refs["models"].items():
        label, bare = info["label"], info["bare"]
        rs = runs.get(base, [])
        is_online = lambda x: x[0].split()[0] == "online"  # noqa: E731 - "online" or "online HTTP"
        offline = sorted([x for x in rs if x[2] == 1 and not is_online(x)], key=lambda x: (x[1], x[3], x[0]))
        online = sorted([x for x in rs if is_online(x)], key=lambda x: x[2])
        online_other = sorted([x for x in rs if x[2] > 1 and not is_online(x)], key=lambda x: (x[0], x[2]))
        md += [f"## {label}", ""]
        if offline:
            md += ["### Offline: client batch sweep, concurrency 1", "",
                   table(offline, "Batch", lambda b, c: b, bare, lambda b, c: b), ""]
        if online or online_other:
            md += ["### Online: requests of batch 1, dynamic batching", "",
                   table(online + online_other, "Concurrency", lambda b, c: c, bare, lambda b, c, r=info.get("online_ref", 64): r), ""]
        if plt is not None:
            for f in plots(base, label, gpu, offline, online, bare, a.out, plt, info.get("engine", "torch")):
                md += [f"![{f}]({f})", ""]
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(md))
    print(f"wrote {os.path.join(a.out, 'report.md')}")


if __name__ == "__main__":
    main()
