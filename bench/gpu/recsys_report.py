#!/usr/bin/env python3
"""Seed-style report of the Criteo-scale recommender runs (issue 8), from the folders
bench/gpu/recsys_perf.py writes (runs.json, ceiling.json, setup.json, exact.json, the CSVs), or
from results folders of `run.sh recommenders` that keep them in their `recsys.tgz`.

Writes into --out: `report.md` (per model: the store and its cache, the batch sweep and the
concurrency sweep in the columns of NVIDIA's DeepLearningExamples Triton reports with the
cache's hit rate, keys/s, the all-in-HBM ceiling and served/ceiling; the other Zipf
exponent; the exactness check; HPS's published figures beside ours) and PNG plots:
throughput vs batch (ensemble, single model, ceiling, HPS's published points), where a
request's time goes per batch, and throughput and p99 vs concurrency.

    python3 bench/gpu/recsys_report.py --runs bench/gpu/results/recommenders/dlrm \\
        bench/gpu/results/recommenders/dcnv2 --out docs/perf/h100/recommenders
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import PARTS, PCTS, breakdown, save, unpacked  # noqa: E402

# Merlin HPS's last published figures (../shared/seeds/002: 1x A100-80GB, 22 B-parameter
# models, hps gpucacheper 0.1, perf_analyzer system shared memory, concurrency 1, FP16,
# HPS + TensorRT ensemble): {model: {batch: (inferences/s, p99 ms)}}
HPS_A100 = {"dlrm": {4096: (2.62e6, 1.74), 65536: (4.30e6, 20.1)},
            "dcnv2": {4096: (1.85e6, 3.56), 65536: (2.45e6, 33.5)}}
# Wide&Deep has no HPS figure; NVIDIA's Triton deployment (../shared/seeds/004: 1x A100-80GB,
# the whole model in TensorRT FP16, perf_analyzer, concurrency 1) published this one.
TRT_A100 = {"wide_deep": {131072: (10.3547e6, 13.16)}}
# per model: (who published, where, {batch: (inferences/s, p99 ms)})
PUBLISHED = {**{m: ("Merlin HPS", "HPS + TensorRT ensemble, concurrency 1 (../shared/seeds/002)", f) for m, f in HPS_A100.items()},
             **{m: ("TensorRT", "the whole model in TensorRT FP16, concurrency 1 (../shared/seeds/004)", f) for m, f in TRT_A100.items()}}
LABEL = {"dlrm": "DLRM", "dcnv2": "DCNv2", "wide_deep": "Wide&Deep"}
PATH = {"ens": "ensemble", "one": "single model"}


def ms(r, k):
    return r[k] / 1e3  # perf_analyzer reports microseconds


def row_cells(r):
    cells = [f"{r['Inferences/Second']:,.0f}"] + [f"{ms(r, k):.3f}" for k in PARTS + PCTS]
    cells.append(f"{sum(ms(r, k) for k in PARTS):.3f}")
    # hits and keys are two counters read one after the other: a ratio a hair above 1 is that
    cells.append("-" if r.get("hit_rate") is None else f"{min(r['hit_rate'], 1.0):.4f}")
    cells.append(f"{r['keys_per_s'] / 1e6:.1f}")
    ceil = r.get("ceiling_ips")
    cells += [f"{ceil:,.0f}" if ceil else "-", f"{r['Inferences/Second'] / ceil:.2f}" if ceil else "-"]
    return cells


def table(runs, key_label, key):
    cols = [key_label, "path", "Inferences/Second", *PARTS, "p50", "p90", "p95", "p99", "Avg latency",
            "cache hit rate", "M keys/s", "ceiling inf/s", "served/ceiling"]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
    for r in runs:
        out.append("| " + " | ".join([str(key(r)), PATH[r["path"]]] + row_cells(r)) + " |")
    return "\n".join(out)


def plot_paths(ax1, ax2, runs, x, tput_label, p99_style, p99_label):
    """Each served path's inferences/s on ax1 and p99 on ax2 against the runs' `x` field."""
    for path, color in (("one", "tab:green"), ("ens", "tab:blue")):
        pts = sorted((r[x], r) for r in runs if r["path"] == path)
        if pts:
            ax1.plot([v for v, _ in pts], [r["Inferences/Second"] for _, r in pts], "o-", color=color,
                     label=tput_label.format(PATH[path]))
            ax2.plot([v for v, _ in pts], [ms(r, "p99 latency") for _, r in pts], p99_style, color=color,
                     label=p99_label.format(PATH[path]))


def plot_batches(plt, m, runs, ceiling, gpu, out):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    batches = sorted({r["batch"] for r in runs})
    plot_paths(ax1, ax2, runs, "batch", "served, {}", "o-", "{}, p99")
    for kind, style in (("graph_ips", "-."), ("eager_ips", ":")):
        pts = [(b, ceiling[str(b)][kind]) for b in batches if str(b) in ceiling and ceiling[str(b)][kind]]
        if pts:
            ax1.plot([b for b, _ in pts], [v for _, v in pts], style, color="gray", marker="x",
                     label=f"ceiling: bare torch, all tables in HBM ({'CUDA graph' if kind == 'graph_ips' else 'eager'})")
    if m in PUBLISHED:
        who, _, pub = PUBLISHED[m]
        ax1.plot(list(pub), [v[0] for v in pub.values()], "s", color="tab:red", label=f"{who}, published (A100-80GB)")
        ax2.plot(list(pub), [v[1] for v in pub.values()], "s", color="tab:red", label=f"{who} p99, published (A100)")
    ax1.set(xscale="log", xlabel="client batch size", ylabel="inferences / second", title=f"{LABEL[m]}: throughput (concurrency 1)")
    ax2.set(xscale="log", yscale="log", xlabel="client batch size", ylabel="ms", title=f"{LABEL[m]}: p99 latency (concurrency 1)")
    for ax in (ax1, ax2):
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(plt, fig, gpu, out, f"{m}_batch.png")


def plot_concurrency(plt, m, runs, batch, gpu, out):
    fig, ax1 = plt.subplots(figsize=(8, 4.5))
    ax2 = ax1.twinx()
    concs = sorted({r["concurrency"] for r in runs})
    plot_paths(ax1, ax2, runs, "concurrency", "{}, inf/s", "x--", "{}, p99 ms")
    ax1.set(xscale="log", xlabel=f"concurrent client requests (batch {batch} each)", ylabel="inferences / second",
            title=f"{LABEL[m]}: batch {batch}, concurrency sweep")
    ax1.set_xticks(concs, [str(c) for c in concs])
    ax2.set_ylabel("p99 ms")
    a, b = ax1.get_legend_handles_labels(), ax2.get_legend_handles_labels()
    ax1.legend(a[0] + b[0], a[1] + b[1], fontsize=8, loc="upper left")
    ax1.grid(alpha=0.3)
    return save(plt, fig, gpu, out, f"{m}_concurrency.png")


def served_network(setup, model):
    """How the run served `model`'s network, from its setup.json (older runs lack the newer keys)."""
    rows = setup.get("graph_rows") or []
    if isinstance(rows, str):
        rows = [r for r in rows.split(",") if r]
    if not setup.get("graphs"):
        how = "eager"
    elif rows:
        how = f"CUDA graphs for requests of {', '.join(str(r) for r in rows)} rows, eager otherwise"
    else:
        how = "CUDA graphs (one per request shape)"
    parts = [how]
    if model == "dlrm" and setup.get("dlrm_interaction"):
        parts.append(f"DLRM interaction `{setup['dlrm_interaction']}`")
    parts.append(f"embeddings into the network as {setup.get('rows_type', 'TYPE_FP32')}")
    if setup.get("pipeline_parts", 1) > 1:
        parts.append(f"single model in {setup['pipeline_parts']} parts (`recommender_pipeline_parts`)")
    if setup.get("host_memory"):
        parts.append(f"host rows `{setup['host_memory']}`")
    return "; ".join(parts)


def gpu_of(folder, results):
    """The GPU's name: recsys_perf.py's gpu.txt where the run wrote one, else nvidia-smi's line in
    the host facts run.sh writes beside the archive (host.txt)."""
    gpu_file = os.path.join(folder, "gpu.txt")
    if os.path.exists(gpu_file):
        return open(gpu_file).read().strip()
    host = os.path.join(results, "host.txt")
    lines = open(host).read().splitlines() if os.path.exists(host) else []
    return next((line.strip() for line in lines if line.startswith("NVIDIA")), "GPU not recorded")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, nargs="+", help="folders written by recsys_perf.py")
    p.add_argument("--out", required=True)
    p.add_argument("--no-plots", action="store_true")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    plt = None
    if not a.no_plots:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    md = []
    for results in a.runs:
        folder = unpacked(results, "recsys.tgz", "recsys")
        load = lambda name: json.load(open(os.path.join(folder, name)))  # noqa: E731
        runs, ceilings, setup, exact = load("runs.json"), load("ceiling.json"), load("setup.json"), load("exact.json")
        gpu_name = gpu_of(folder, results)
        gpu = f"{gpu_name}; perf_analyzer gRPC, {setup.get('shared_memory', 'system')} shared memory, FP16"
        first_alpha = runs[0]["alpha"]
        for m in sorted({r["model"] for r in runs}, key=lambda m: list(LABEL).index(m)):
            rs = [r for r in runs if r["model"] == m]
            ceiling = ceilings.get(m, {})
            if not md:
                md = [f"# Recommenders at Criteo scale — {gpu_name.split(',')[0]}", "",
                      "Generated by `bench/gpu/recsys_report.py` from `bench/gpu/recsys_perf.py`'s output; how to "
                      "reproduce it is in docs/performance.md. Latencies in ms. One perf_analyzer step is a whole request "
                      "of `batch` rows (non-batching models), so Inferences/Second is requests/s × batch.", ""]
            md += [f"## {LABEL[m]}", "",
                   f"{gpu}. Store: {setup['tables']} tables, {setup['rows']:,} rows of dim {setup['dim']} "
                   f"({setup['parameters'] / 1e9:.1f} B parameters, {setup['table_gb_fp16']:.1f} GB fp16 in host memory); "
                   f"GPU cache per instance: {setup['cached_rows']:,} rows ({setup['cached_rows'] / setup['rows']:.1%} of "
                   f"the rows, `gpucache_allocation: {setup.get('allocation', 'per_table')}`). Keys: Zipf per table, a pool of "
                   f"{setup['requests_per_pool']} distinct requests at batch ≤ 4096 (fewer above) that perf_analyzer cycles. "
                   "Stationary hit rate (an endless stream of this law, the cache holding each table's hottest keys): "
                   + ", ".join(f"α {x}: {h:.4f}" for x, h in setup.get("stationary_hit_rate", {}).items()) + ".", "",
                   f"Served network: {served_network(setup, m)}. "
                   "Ceiling: the same TorchScript network in torch with every table in HBM (one fp16 tensor, one gather), "
                   "keys already on the GPU, best of eager and CUDA graph; served/ceiling divides by it.", ""]
            offline = sorted([r for r in rs if r["alpha"] == first_alpha and r["concurrency"] == 1], key=lambda r: (r["batch"], r["path"]))
            # the concurrency sweep's batch: 4096 for DLRM and DCNv2 (issue 8), Wide&Deep's own
            conc_batch = min({r["batch"] for r in rs if r["concurrency"] > 1}, default=None)
            conc = sorted([r for r in rs if r["alpha"] == first_alpha and r["batch"] == conc_batch], key=lambda r: (r["concurrency"], r["path"]))
            other = sorted([r for r in rs if r["alpha"] != first_alpha], key=lambda r: (r["alpha"], r["batch"], r["path"]))
            md += [f"### Batch sweep, concurrency 1, Zipf α {first_alpha}", "", table(offline, "Batch", lambda r: r["batch"]), ""]
            if len({r["concurrency"] for r in conc}) > 1:
                md += [f"### Batch {conc_batch}, concurrency sweep, Zipf α {first_alpha}", "", table(conc, "Concurrency", lambda r: r["concurrency"]), ""]
            if other:
                md += ["### Other Zipf exponents, concurrency 1", "", table(other, "Batch (α)", lambda r: f"{r['batch']} (α {r['alpha']})"), ""]
            if m in PUBLISHED:
                who, where, pub = PUBLISHED[m]
                short = "HPS" if who == "Merlin HPS" else who
                md += [f"### Beside {who}'s published figures", "",
                       f"{short}: 1× A100-80GB, {where}. Ours: this GPU, concurrency 1, best path.", "",
                       f"| batch | {short} inf/s | {short} p99 | ours inf/s | ours p99 | path | ratio |", "|---:|---:|---:|---:|---:|---|---:|"]
                for b, (ips, p99) in pub.items():
                    cands = [r for r in offline if r["batch"] == b]
                    if cands:
                        best = max(cands, key=lambda r: r["Inferences/Second"])
                        md.append(f"| {b} | {ips / 1e6:.2f} M | {p99:.2f} | {best['Inferences/Second'] / 1e6:.2f} M | "
                                  f"{ms(best, 'p99 latency'):.2f} | {PATH[best['path']]} | {best['Inferences/Second'] / ips:.2f} |")
                md.append("")
            e = exact.get(m)
            if e:
                md += [f"Exactness under this load: {e['rows_checked']:,} served rows of `{m}_sparse` against the fixture's "
                       f"rows recomputed from its seed, max abs diff {e['rows_max_abs_diff']}; single model against the "
                       f"ensemble, max abs diff {e['single_vs_ensemble_max_abs_diff']}."
                       + (f" One request of {e['largest_batch']['batch']:,} rows: {e['largest_batch']['rows_checked']:,} rows, "
                          f"max abs diff {e['largest_batch']['rows_max_abs_diff']}; single model against the ensemble "
                          f"{e['largest_batch']['single_vs_ensemble_max_abs_diff']}." if "largest_batch" in e else "")
                       + (f" Keys sent in CUDA shared memory (read by the lookup on the GPU), one request of "
                          f"{e['cuda_shm']['batch']:,} rows: {e['cuda_shm']['rows_checked']:,} rows, max abs diff "
                          f"{e['cuda_shm']['rows_max_abs_diff']}." if "cuda_shm" in e else ""), ""]
            loose = [r for r in rs if r.get("stability_pct", 10) > 10]
            if loose:
                md += ["Measured with perf_analyzer's stability bound loosened (its last windows differed by more than "
                       "10% at the first windows; longer windows, then this bound): "
                       + ", ".join(f"{PATH[r['path']]} batch {r['batch']} concurrency {r['concurrency']} α {r['alpha']} "
                                   f"(-s {r['stability_pct']})" for r in loose) + ".", ""]
            if plt is not None:
                files = [plot_batches(plt, m, offline, ceiling, gpu, a.out)]
                if len({r["concurrency"] for r in conc}) > 1:
                    files.append(plot_concurrency(plt, m, conc, conc_batch, gpu, a.out))
                for path in ("one", "ens"):
                    bars = [(str(r["batch"]), {k: ms(r, k) for k in PARTS}) for r in offline if r["path"] == path]
                    if bars:
                        files.append(breakdown(plt, bars, "client batch size", f"{LABEL[m]}, {PATH[path]}: where a request's time goes",
                                               gpu, a.out, f"{m}_{path}_breakdown.png"))
                md += [f"![{f}]({f})" for f in files] + [""]
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(md))
    print(f"wrote {os.path.join(a.out, 'report.md')}")


if __name__ == "__main__":
    main()
