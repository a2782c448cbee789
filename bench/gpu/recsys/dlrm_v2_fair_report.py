"""bench/gpu/dlrm_v2_fair.py's figures and report: the dense peaks the TFLOP/s are set against,
the served and reference figures side by side with their ratios, the console's summary, the plot
(fair.png) and README.md."""
import os

from .dlrm_v2_fair_model import log

# dense tensor peaks, TFLOP/s (NVIDIA's datasheets; the H200 SXM is the H100 SXM's chip)
# (peaks_for takes the first whose name the GPU's holds: the PCIe and NVL parts before the SXM ones)
PEAKS = [("H100 PCIe", {"fp16": 756.0, "fp8": 1513.0}), ("H100 NVL", {"fp16": 835.0, "fp8": 1671.0}),
         ("H200 NVL", {"fp16": 835.0, "fp8": 1671.0}), ("H100", {"fp16": 989.0, "fp8": 1979.0}),
         ("H200", {"fp16": 989.0, "fp8": 1979.0})]
DEFAULT_PEAK = {"fp16": 989.0, "fp8": 1979.0}


def peaks_for(gpu):
    for key, p in PEAKS:
        if key in gpu:
            return dict(p), key
    return dict(DEFAULT_PEAK), "H100 SXM (the GPU's own not known here)"


def best_of(rows):
    return max(rows, key=lambda r: r["pairs_per_s"]) if rows else None


def add_figures(out):
    """out["figures"][precision]: the served and reference figures side by side, ratios, TFLOP/s."""
    figs = {}
    ref = (out.get("reference") or {}).get("precisions", {})
    for p in out["precisions"]:
        s, r, pk = out["served"].get(p, {}), ref.get(p, {}), out["package"].get(p, {})
        peak = out["peaks_tflops"][p]
        fpp = r.get("flops_per_pair") or 32.06e6
        headline = [x for x in s.get("perf_analyzer", []) if x["concurrency"] == 8] or s.get("perf_analyzer", [])
        f = {"peak_tflops": peak, "flops_per_pair": fpp,
             "served_pa": best_of(headline), "served_pa_best": best_of(s.get("perf_analyzer", [])),
             "served_stream": best_of(s.get("stream", [])), "served_accuracy": s.get("accuracy_fp32"),
             "ref_serial": r.get("serial_pairs_per_s"), "ref_overlap": r.get("overlap_pairs_per_s"),
             "ref_overlap_streams": r.get("overlap_best_streams"), "ref_ideal": r.get("ideal_pairs_per_s"),
             "ref_accuracy": r.get("accuracy_fp32"), "ref_net_tflops": r.get("tflops"), "ref_graphs": r.get("graphs")}
        if r.get("tflops"):
            f["ref_net_pct_peak"] = 100 * r["tflops"] / peak
        if pk.get("net_s"):
            f["package_net_tflops"] = fpp * out["batch"] / pk["net_s"] / 1e12
            f["package_net_pct_peak"] = 100 * f["package_net_tflops"] / peak
        f["ratios"] = {}
        for sk, sv in (("perf_analyzer", f["served_pa"]), ("stream", f["served_stream"])):
            if not sv:
                continue
            for rk in ("serial", "overlap", "ideal"):
                if f[f"ref_{rk}"]:
                    f["ratios"][f"{sk}/{rk}"] = sv["pairs_per_s"] / f[f"ref_{rk}"]
            f[f"served_{sk}_tflops"] = sv["pairs_per_s"] * fpp / 1e12
        figs[p] = f
    out["figures"] = figs


def m(x):
    return "-" if x is None else f"{x / 1e6:.2f} M"


def ratio(x):
    return "-" if x is None else f"{x:.2f}×"


def inflight(x, word="in flight"):
    return f"({x['concurrency']} {word})" if x else ""


def acc(x):
    return "-" if x is None else f"{x:.3g}"


def summary_lines(out):
    lines = []
    for p, f in out.get("figures", {}).items():
        pa, st = f["served_pa"], f["served_stream"]
        lines.append(f"{p}: served {m(pa and pa['pairs_per_s'])} (perf_analyzer, {pa and pa['concurrency']} in flight), "
                     f"{m(st and st['pairs_per_s'])} (stream, {st and st['concurrency']}); reference one after the other "
                     f"{m(f['ref_serial'])}, overlapped {m(f['ref_overlap'])} ({f['ref_overlap_streams']} streams), "
                     f"ideal {m(f['ref_ideal'])}")
        lines.append(f"  ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in f["ratios"].items()))
        lines.append(f"  network alone: reference {f['ref_net_tflops'] or 0:.0f} TFLOP/s "
                     f"({f.get('ref_net_pct_peak', 0):.0f}% of {p}'s {f['peak_tflops']:.0f}), package "
                     f"{f.get('package_net_tflops', 0):.0f} TFLOP/s ({f.get('package_net_pct_peak', 0):.0f}%); "
                     f"predictions vs fp32 max abs diff: served {acc(f['served_accuracy'])}, reference {acc(f['ref_accuracy'])}")
    return lines


def plot(out, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figs = out["figures"]
    bars = [("served, perf_analyzer", lambda f: f["served_pa"] and f["served_pa"]["pairs_per_s"], "tab:brown"),
            ("served, endless stream", lambda f: f["served_stream"] and f["served_stream"]["pairs_per_s"], "tab:purple"),
            ("reference, one after the other", lambda f: f["ref_serial"], "tab:gray"),
            ("reference, overlapped on streams", lambda f: f["ref_overlap"], "tab:blue"),
            ("reference, ideal overlap", lambda f: f["ref_ideal"], "lightsteelblue")]
    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.8 / len(bars)
    top = 0.0
    for i, (label, get, color) in enumerate(bars):
        xs, ys = [], []
        for j, p in enumerate(figs):
            v = get(figs[p])
            if v:
                xs.append(j + (i - (len(bars) - 1) / 2) * width)
                ys.append(v / 1e6)
        top = max([top] + ys)
        b = ax.bar(xs, ys, width, label=label, color=color)
        ax.bar_label(b, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(figs)))
    ax.set_xticklabels([f"{p} network\npredictions vs fp32: served {acc(figs[p]['served_accuracy'])}, "
                        f"reference {acc(figs[p]['ref_accuracy'])}" for p in figs], fontsize=8)
    ax.set_ylim(0, top * 1.3 if top else 1)
    ax.set_ylabel("M pairs/s")
    ax.set_title(f"DLRM-v2, every row in HBM, batch {out['batch']:,}: served against a bare reference of the same "
                 f"precision\n{out['gpu']}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", ncol=3)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(folder, out):
    if "figures" not in out:
        add_figures(out)
    figs = out["figures"]
    ref = out.get("reference") or {}
    try:
        plot(out, os.path.join(folder, "fair.png"))
        plotted = True
    except Exception as e:  # noqa: BLE001 - the tables stand without it
        log(f"  (no plot: {e})")
        plotted = False
    streams = ", ".join(str(s) for s in ref.get("streams", []))
    L = [f"# DLRM-v2: served against a bare reference of the same precision and overlap — {out['gpu']}", "",
         "Written by `bench/gpu/dlrm_v2_fair.py` (issue 65, point 3), one device call, "
         f"{out['date']}; the numbers in `results.json`, everything printed in `console.log` (the GPU and host "
         "at its head); `call.tgz` holds run.sh's `host.txt`, nvidia-smi dmon's samples and both served runs' own "
         "folders (README, setup.json, runs.json, perf_analyzer's CSVs in perf.tgz).", "",
         "    " + out["command"], "",
         f"GPU: **{out['gpu']}** ({out['gpu_memory']}, driver {out['driver']}). MLPerf DLRM-v2 at scale {out['scale']} "
         f"(every row in HBM, fp16 rows), batch **{out['batch']:,} pairs**. Served: the recommender as the headline run "
         f"serves it (`dlrm_v2_perf.py`: {out['instances']} KIND_GPU instances, the network an AOTInductor package "
         f"with the cross layers as our Triton kernels, CUDA graphs, dynamic batching), requests of "
         f"{out['big_pairs']:,} pairs (MLPerf's Offline shape; two make one execution of {out['batch']:,}) from "
         "perf_analyzer (gRPC sync, CUDA shared memory) and from the endless stream. Reference: the same network "
         "module the package is exported from (same precision, same Triton kernels) torch.compile'd and replayed as "
         "CUDA graphs, after `F.embedding_bag` (sum) over the same 26 fp16 tables in HBM, stacked to "
         f"[batch, 26, 128]; one after the other on one stream, and overlapped on {streams} CUDA streams, each "
         "replaying its own graphs of lookup + network (several batches in flight, as the served instances "
         "overlap); the ideal overlap is batch / max(lookup, network).", ""]
    if plotted:
        L += ["![served against the references](fair.png)", ""]
    L += ["| network | served, perf_analyzer | served, endless stream | reference, one after the other | "
          "reference, overlapped (best) | ideal overlap | served / one after the other | served / overlapped | "
          "served / ideal |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p, f in figs.items():
        pa, st = f["served_pa"], f["served_stream"]
        r = f["ratios"]

        def both(k):
            return " / ".join(ratio(r.get(f"{s}/{k}")) for s in ("perf_analyzer", "stream"))
        L.append(f"| {p} | {m(pa and pa['pairs_per_s'])} {inflight(pa)} | "
                 f"{m(st and st['pairs_per_s'])} {inflight(st)} | {m(f['ref_serial'])} | "
                 f"{m(f['ref_overlap'])} {'(%s streams)' % f['ref_overlap_streams'] if f['ref_overlap_streams'] else ''} | "
                 f"{m(f['ref_ideal'])} | {both('serial')} | "
                 f"{both('overlap')} | {both('ideal')} |")
    L += ["", "Ratios: perf_analyzer's figure / the endless stream's. pairs/s throughout.", "",
          "## The network's rate and the accuracy beside each figure", "",
          f"TFLOP/s count the network's matrix products ({next(iter(figs.values()))['flops_per_pair'] / 1e6:.2f} MFLOP "
          "a pair) whatever their type, against the dense tensor peak of the network's own type "
          f"({out['peaks_of']}: fp16 {out['peaks_tflops']['fp16']:.0f}, FP8 {out['peaks_tflops']['fp8']:.0f} "
          "TFLOP/s). Accuracy: the predictions' max abs difference from the PyTorch fp32 network on the same "
          "inputs (the served exactness check's 4,320 pairs, their rows the fixture's; served: the answers "
          "tritonserver gave; reference: the timed graph of the compiled network on the same pairs' rows pooled "
          "by `F.embedding_bag`).", "",
          "| network | reference network alone | % of its peak | served package alone (aoti_bare) | % of its peak | "
          "served end to end (perf_analyzer) | % of its peak | served vs fp32 | reference vs fp32 |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p, f in figs.items():
        def tf(x):
            return "-" if not x else f"{x:.0f} TFLOP/s"

        def pct(x):
            return "-" if not x else f"{x:.0f}% of {f['peak_tflops']:.0f}"
        e2e = f.get("served_perf_analyzer_tflops")
        L.append(f"| {p} | {tf(f['ref_net_tflops'])} | {pct(f.get('ref_net_pct_peak'))} | "
                 f"{tf(f.get('package_net_tflops'))} | {pct(f.get('package_net_pct_peak'))} | {tf(e2e)} | "
                 f"{pct(e2e and 100 * e2e / f['peak_tflops'])} | {acc(f['served_accuracy'])} | {acc(f['ref_accuracy'])} |")
    L += ["", "## The reference's parts", "",
          "| network | network alone (ms) | lookup alone (ms) | lookup's rows (GB/s) | one after the other | "
          "overlapped on N streams | CUDA graphs | compile (s) |", "|---|---:|---:|---:|---:|---|---|---:|"]
    for p, x in (ref.get("precisions") or {}).items():
        if "net_s" not in x:
            L.append(f"| {p} | {x.get('error', 'no figure')} | | | | | | |")
            continue
        ov = ", ".join(f"{k}: {v['pairs_per_s'] / 1e6:.2f} M" for k, v in x["overlap"].items()) or "-"
        L.append(f"| {p} | {x['net_s'] * 1e3:.3f} | {x['lookup_s'] * 1e3:.3f} | {x['lookup_gb_per_s']:.0f} | "
                 f"{m(x['serial_pairs_per_s'])} | {ov} | {'yes' if x['graphs'] else 'no: ' + x.get('graph_error', '')[:80]} | "
                 f"{x['compile_s']:.0f} |")
    L += ["", "## Served runs", "",
          "| network | perf_analyzer (in flight: pairs/s, p99 ms, pairs an execution) | endless stream | "
          "lookup exact (max abs diff vs float64) | served vs the module it was exported from |", "|---|---|---|---:|---:|"]
    for p, s in out["served"].items():
        pa = "; ".join(f"{x['concurrency']}: {m(x['pairs_per_s'])}, {x['p99_ms']:.1f}, "
                       f"{x['pairs_per_execution'] or 0:,.0f}" for x in s.get("perf_analyzer", [])) or "-"
        st = "; ".join(f"{x['concurrency']}: {m(x['pairs_per_s'])}, p99 {x['p99_ms']:.1f} ms" for x in s.get("stream", [])) or "-"
        L.append(f"| {p} | {pa} | {st} | {acc(s.get('lookup_max_abs_diff'))} | {acc(s.get('accuracy_vs_module'))} |")
    if out.get("phases"):
        L += ["", "Phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in out["phases"].items()) + "."]
    for s in out.get("skipped", []):
        L.append(f"- Skipped: {s}")
    for s in out.get("failures", []):
        L.append(f"- FAIL: {s}")
    with open(os.path.join(folder, "README.md"), "w") as fh:
        fh.write("\n".join(L) + "\n")
