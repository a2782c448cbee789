#!/usr/bin/env python3
"""Issue 47's figures from one call of bench/gpu/dlrm_v2_placements.sh: the best rate of each
run (perf_analyzer's MLPerf-like queries, and the endless stream), per GPU, the exactness
checks, and the ratios the issue sets targets for (two GPUs against one, replicated; sharded
against replicated on the same two GPUs). Reads each run's runs.json, from its folder, from the
.tgz run.sh --pack made of it, or from runs.tgz (the committed form). With --rounds, each
round's figures and ratios, and the verdict on the median of the rounds' ratios.

  python3 bench/gpu/placements_summary.py FOLDER [--plot=PNG]   # FOLDER holds <run>/, <run>.tgz or runs.tgz

--plot=PNG draws each run's best endless-stream rate, stacked by GPU.
"""
import json
import os
import sys
import tarfile

RUNS = {
    "replicated_0": "replicated, one GPU (GPU 0)",
    "replicated_01": "replicated, two GPUs",
    "sharded_01": "sharded, two GPUs, fp16 rows",
    "sharded_01_fp32": "sharded, two GPUs, fp32 rows",
    "sharded_01_fp32_once": "sharded, two GPUs, fp32 rows, every table once (gpucache_sharded_replicate 0)",
    "sharded_01_fp32_hot": "sharded, two GPUs, fp32 rows, gpucache_sharded_replicate 0.35 (the most lookups a byte on every GPU)",
    "sharded_01_fp32_hot_h100": "sharded, two GPUs, fp32 rows, gpucache_sharded_replicate 0.35, at most 71 GB of rows a GPU "
                                "(an H100 80GB's plan)",
    "replicated_01_fp32_half": "replicated, two GPUs, fp32 rows, scale 0.5 (52 GB: fits one GPU)",
}
# the plot's short names
LABELS = {
    "replicated_0": "replicated\none GPU",
    "replicated_01": "replicated\ntwo GPUs",
    "sharded_01": "sharded\nfp16 rows",
    "sharded_01_fp32": "sharded fp32,\nsmall tables copied",
    "sharded_01_fp32_once": "sharded fp32,\nevery table once",
    "sharded_01_fp32_hot": "sharded fp32,\nreplicate 0.35",
    "sharded_01_fp32_hot_h100": "sharded fp32,\nreplicate 0.35,\nan H100's plan",
    "replicated_01_fp32_half": "replicated fp32,\nhalf the rows",
}
# (target, numerator, denominator, bound)
TARGETS = [
    ("replicated: two GPUs >= 1.9x one GPU (endless stream)", "replicated_01", "replicated_0", "stream", 1.9),
    ("replicated: two GPUs against one GPU (perf_analyzer, MLPerf-like)", "replicated_01", "replicated_0", "mlperf", None),
    ("sharded >= 0.8x replicated on the same GPUs (endless stream)", "sharded_01", "replicated_01", "stream", 0.8),
    ("sharded against replicated (perf_analyzer, MLPerf-like)", "sharded_01", "replicated_01", "mlperf", None),
    ("sharded fp32 rows (fit no H100) >= 0.8x replicated fp16 (endless stream)", "sharded_01_fp32", "replicated_01",
     "stream", 0.8),
    ("sharded fp32 rows against replicated fp16 (perf_analyzer, MLPerf-like)", "sharded_01_fp32", "replicated_01",
     "mlperf", None),
    ("sharded fp32 rows >= 0.8x replicated fp32 rows at half the rows (endless stream)", "sharded_01_fp32",
     "replicated_01_fp32_half", "stream", 0.8),
    ("sharded fp32 rows against replicated fp32 rows at half the rows (perf_analyzer, MLPerf-like)",
     "sharded_01_fp32", "replicated_01_fp32_half", "mlperf", None),
    ("sharded fp32 rows, small tables on every GPU, against every table once (endless stream)", "sharded_01_fp32",
     "sharded_01_fp32_once", "stream", None),
    ("the same (perf_analyzer, MLPerf-like)", "sharded_01_fp32", "sharded_01_fp32_once", "mlperf", None),
    ("sharded fp32 rows, replicate 0.35, >= 0.8x replicated fp16 (endless stream)", "sharded_01_fp32_hot",
     "replicated_01", "stream", 0.8),
    ("the same (perf_analyzer, MLPerf-like)", "sharded_01_fp32_hot", "replicated_01", "mlperf", None),
    ("sharded fp32 rows, replicate 0.35, >= 0.8x replicated fp32 rows at half the rows (endless stream)",
     "sharded_01_fp32_hot", "replicated_01_fp32_half", "stream", 0.8),
    ("the same (perf_analyzer, large requests)", "sharded_01_fp32_hot", "replicated_01_fp32_half", "big", None),
    ("sharded fp32 rows, an H100's plan, >= 0.8x replicated fp32 rows at half the rows (endless stream)",
     "sharded_01_fp32_hot_h100", "replicated_01_fp32_half", "stream", 0.8),
    ("the same (perf_analyzer, large requests)", "sharded_01_fp32_hot_h100", "replicated_01_fp32_half", "big", None),
    # requests larger than MLPerf's queries (dlrm_v2_perf.py --big-concurrency), where the queries a
    # second through the front end do not hold the rate: how the GPUs themselves scale
    ("replicated: two GPUs against one GPU (perf_analyzer, large requests)", "replicated_01", "replicated_0", "big",
     None),
    ("sharded fp32 rows against replicated fp16 (perf_analyzer, large requests)", "sharded_01_fp32", "replicated_01",
     "big", None),
    # 270-pair queries (dlrm_v2_perf.py --concurrency: perf_analyzer -b 270, gRPC)
    ("replicated: two GPUs against one GPU (perf_analyzer, 270-pair queries)", "replicated_01", "replicated_0",
     "fixed270", None),
    # 270-pair queries in-process through Triton's C API (dlrm_v2_perf.py --capi-concurrency): the
    # same scheduler and backend without the gRPC front end, inputs from host memory
    ("replicated: two GPUs against one GPU (in-process, Triton's C API)", "replicated_01", "replicated_0",
     "fixed270_capi", None),
    ("sharded fp32 rows against replicated fp16 (in-process, Triton's C API)", "sharded_01_fp32", "replicated_01",
     "fixed270_capi", None),
]
KINDS = ("mlperf", "stream", "fixed270", "big", "fixed270_capi")
OPTIONAL = ("fixed270", "big", "fixed270_capi")  # printed where a run of the call measured them


def load(folder, name):
    """The run's runs.json, or None."""
    path = os.path.join(folder, name, "runs.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    # run.sh --pack's <run>.tgz, or the committed runs.tgz holding every run's folder
    for tgz in (os.path.join(folder, name + ".tgz"), os.path.join(folder, "runs.tgz")):
        if not os.path.exists(tgz):
            continue
        with tarfile.open(tgz) as t:
            for member in (f"{name}/runs.json", f"./{name}/runs.json"):
                try:
                    return json.load(t.extractfile(member))
                except KeyError:
                    continue
    return None


def best(res, kind):
    """The run of `kind` ("stream", or perf_analyzer's "mlperf") with the most pairs/s."""
    runs = res.get("stream", []) if kind == "stream" else [r for r in res.get("perf", []) if r["kind"] == kind]
    return max(runs, key=lambda r: r["pairs_per_s"], default=None)


def line(r):
    if r is None:
        return "no figure"
    gpus = ", ".join(f"{d} {v / 1e6:.2f} M" for d, v in sorted(r.get("per_device", {}).items()))
    return (f"{r['pairs_per_s'] / 1e6:6.2f} M pairs/s at c={r['concurrency']}, p99 {r['p99_ms']:.1f} ms"
            + (f" ({gpus})" if gpus else ""))


def rounds_of(folder, name):
    """The run's rounds in turn (dlrm_v2_placements.sh --rounds): <name>, <name>_r2, ... while found."""
    found = [load(folder, name)]
    k = 2
    while (res := load(folder, f"{name}_r{k}")) is not None:
        found.append(res)
        k += 1
    return found


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def gpu_name(folder):
    """The GPUs' name from the call's topo.txt (nvidia-smi's `index, name, memory` lines), or None."""
    try:
        with open(os.path.join(folder, "topo.txt")) as f:
            names = {p[1].strip() for p in (ln.split(",") for ln in f) if len(p) == 3 and p[0].strip().isdigit()}
    except OSError:
        return None
    return " + ".join(sorted(names)) or None


def plot(found, png, gpu=None, kind="stream"):
    """Each run's best `kind` figure as a bar of pairs/s, stacked by GPU (the server's per-GPU
    counts), the runs the call made in RUNS' order."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bars = [(name, best(res, kind)) for name, res in found.items() if res and best(res, kind)]
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(1.9 * len(bars) + 2.5, 4.6))
    colors = {"GPU 0": "tab:blue", "GPU 1": "tab:orange"}
    for i, (name, r) in enumerate(bars):
        parts = sorted((r.get("per_device") or {"all": r["pairs_per_s"]}).items())
        bottom = 0.0
        for dev, v in parts:
            ax.bar(i, v / 1e6, bottom=bottom, color=colors.get(dev, "tab:gray"), edgecolor="white",
                   label=dev if dev not in ax.get_legend_handles_labels()[1] else None)
            bottom += v / 1e6
        ax.annotate(f"{r['pairs_per_s'] / 1e6:.2f} M", (i, bottom), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(bars)), [LABELS.get(n, n) for n, _ in bars], fontsize=8)
    ax.set(ylabel="M pairs / second", title=f"DLRM-v2 over two GPUs ({kind}, best of each run)"
           + (f" - {gpu}" if gpu else ""))
    ax.set_ylim(top=ax.get_ylim()[1] * 1.1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main():
    args = [x for x in sys.argv[1:] if not x.startswith("--plot=")]
    png = next((x.split("=", 1)[1] for x in sys.argv[1:] if x.startswith("--plot=")), None)
    folder = args[0] if args else "."
    rounds = {name: rounds_of(folder, name) for name in RUNS}
    found = {name: r[0] for name, r in rounds.items()}
    for name, what in RUNS.items():
        res = found[name]
        print(f"{name}: {what}")
        if res is None:
            print("  not run (or no runs.json)")
            continue
        for k, later in enumerate(rounds[name][1:], start=2):
            for kind in KINDS:
                if kind not in OPTIONAL or best(later, kind):
                    print(f"  round {k} {kind:<6} {line(best(later, kind))}")
        ex = res.get("exactness") or {}
        lk, pr = ex.get("lookup"), ex.get("prediction")
        if lk:
            shares = "; ".join(f"{m} " + ", ".join(f"{d} {v:.2f}" for d, v in sorted(s.items()))
                               for m, s in lk.get("per_gpu", {}).items())
            print(f"  exactness: {lk['pooled_rows']:,} pooled rows, {lk['bad_values']} values outside the bound "
                  f"(max abs diff {lk['max_abs_diff']:.3g}); predictions max abs diff {pr['max_abs_diff_fp32']:.3g} "
                  f"(bound {pr['bound']}); answered per GPU: {shares or '-'}")
        else:
            print(f"  exactness: not measured ({'; '.join(ex.get('failures', [])) or 'no record'})")
        for kind in KINDS:
            if kind not in OPTIONAL or best(res, kind):
                print(f"  {kind:<6} {line(best(res, kind))}")
    print()
    for what, num, den, kind, bound in TARGETS:
        a, b = found[num], found[den]
        ra, rb = (best(a, kind) if a else None), (best(b, kind) if b else None)
        if kind in OPTIONAL and ra is None and rb is None:
            continue  # no run of the call measured them
        if ra is None or rb is None:
            print(f"-    {what}: no ratio ({num if ra is None else den} has no figure)")
            continue
        ratio = ra["pairs_per_s"] / rb["pairs_per_s"]
        # each round's ratio, its two runs from the same round; the verdict on their median
        each = []
        for a_k, b_k in zip(rounds[num], rounds[den]):
            r_a, r_b = (best(a_k, kind) if a_k else None), (best(b_k, kind) if b_k else None)
            if r_a is not None and r_b is not None:
                each.append(r_a["pairs_per_s"] / r_b["pairs_per_s"])
        judged = median(each) if len(each) > 1 else ratio
        verdict = "-   " if bound is None else ("PASS" if judged >= bound else "MISS")
        print(f"{verdict} {what}: {ra['pairs_per_s'] / 1e6:.2f} / {rb['pairs_per_s'] / 1e6:.2f} M = {ratio:.2f}x"
              + (f"; rounds {', '.join(f'{x:.2f}x' for x in each)}, median {judged:.2f}x" if len(each) > 1 else ""))
    if png:
        print(f"plot: {plot(found, png, gpu_name(folder)) or 'no run to draw'}")


if __name__ == "__main__":
    main()
