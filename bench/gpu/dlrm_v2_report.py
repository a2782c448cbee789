#!/usr/bin/env python3
"""The seed-style report of bench/gpu/dlrm_v2_perf.py (MLPerf's DLRM-v2 served, issue 46): README.md
and two PNG plots in the results folder, from its setup.json and runs.json. dlrm_v2_perf.py calls
`write` at the end of its run; this command writes them again from a results folder:

    python3 bench/gpu/dlrm_v2_report.py --results bench/gpu/results/dlrm-v2/two_instances

Tables in the columns of NVIDIA's DeepLearningExamples Triton reports (perf_analyzer's, in ms),
with pairs/s, queries/s and lookups/s beside them; the bare PyTorch reference; the issue's targets
as PASS/MISS lines (`targets`, which dlrm_v2_perf.py prints too)."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import PARTS, PCTS, save  # noqa: E402

LOOKUPS_PER_PAIR = 214  # MLPerf DLRM-v2's hotness, all tables together
P99_BOUND_MS = 60.0     # MLPerf's server-scenario latency bound for DLRM-v2
HTTP_MODES = ("http", "httpsync")  # perf_analyzer's calls over HTTP (dlrm_v2_perf.py --pa-modes)
KIND_LABEL = {
    "fixed270": "270-pair queries (perf_analyzer -b 270 on dlrm_v2)",
    "fixed270_ensemble": "270-pair queries through the twin (perf_analyzer, dlrm_v2_queries)",
    "mlperf": "MLPerf-like 100-700 pairs per query (perf_analyzer, dlrm_v2_queries)",
    "stream": "endless stream of queries (stream_client, HTTP; 270 pairs each unless the run says)",
    "lookup": "pooled lookup alone (perf_analyzer -b 270 on dlrm_v2_lookup)",
    "probe1": "one-pair queries (perf_analyzer -b 1 on dlrm_v2)",
    "big": "large requests, MLPerf's Offline shape (perf_analyzer, --big-pairs each through dlrm_v2_queries)",
    "fixed270_capi": "270-pair queries in-process, Triton's C API (perf_analyzer -b 270, no gRPC)",
}
STYLE = {"fixed270": ("o-", "tab:green"), "fixed270_ensemble": ("^--", "tab:olive"),
         "mlperf": ("s-", "tab:blue"), "stream": ("x:", "tab:purple"), "lookup": ("o-", "tab:orange"),
         "probe1": ("d-", "tab:gray"), "big": ("v-", "tab:brown"), "fixed270_capi": ("P-", "tab:cyan")}
MODE_LINE = {"sync": ":", "async": "-", "grpcstream": "--", "http": "-.", "httpsync": "-."}


# ------------------------------------------------------------------ figures

def calls(r, word=""):
    """How perf_analyzer called: its mode (then `word`), and the gRPC calls to a connection, or
    the C API's shared memory, where a run set them."""
    share, shm = r.get("channel_share"), r.get("shm")
    return ((r.get("pa_mode") or "") + word + ("" if share is None else f", {share} to a connection")
            + ("" if shm is None else f", {shm} shared memory"))


def series(rows, kind):
    """(label, style, color, rows) for each of perf_analyzer's ways of calling among `kind`'s rows:
    one line per way where a run measured several (sync calls dotted, the gRPC stream dashed;
    --pa-channel-shares' runs each their own line)."""
    ways = sorted({calls(r) for r in rows if r["kind"] == kind})
    style, color = STYLE[kind]
    for w in ways:
        sel = [r for r in rows if r["kind"] == kind and calls(r) == w]
        if len(ways) > 1:
            mode = w.split(",")[0]
            yield f"{KIND_LABEL[kind]}, {calls(sel[0], ' calls')}", style[0] + MODE_LINE.get(mode, "-"), color, sel
        else:
            yield KIND_LABEL[kind], style, color, sel


def stream_note(setup, res):
    """What the endless stream sent: the run's note, with its queries' size taken from the runs
    (runs before --stream-pairs said 270 pairs whatever they sent)."""
    note = setup.get("stream_note", "not run")
    sizes = {r.get("batch") for r in res.get("stream", [])} - {None, 270}
    if len(sizes) == 1 and note.startswith("270-pair queries"):
        note = f"queries of {sizes.pop()} pairs" + note[len("270-pair queries"):]
    return note


def best(rows, key):
    return max(rows, key=lambda r: r[key]) if rows else None


def reference_best(res):
    """(the reference's best pairs/s of lookup and network one after the other, its best lookups/s
    of the pooled lookup alone), None where the reference did not run."""
    ref = res.get("reference") or {}
    batches = list((ref.get("batches") or {}).values())
    if not batches:
        return None, None
    return max(b["pairs_per_s"] for b in batches), max(b["lookups_per_s"] for b in batches)


def measured_hit_rate(res):
    """(the hit rate measured, where): the endless stream's at its largest concurrency, else the
    270-pair perf_analyzer run's at its largest concurrency (its small pool repeats: above the
    stream's)."""
    stream = [r for r in res.get("stream", []) if r.get("hit_rate") is not None]
    if stream:
        r = max(stream, key=lambda r: r["concurrency"])
        return r["hit_rate"], f"endless stream, concurrency {r['concurrency']}"
    fixed = [r for r in res.get("perf", []) if r["kind"] == "fixed270" and r.get("hit_rate") is not None]
    if fixed:
        r = max(fixed, key=lambda r: r["concurrency"])
        return r["hit_rate"], f"perf_analyzer's pool of {r.get('pool', '?')}, concurrency {r['concurrency']}"
    return None, "no hit rate measured"


def targets(setup, res):
    """The issue's targets for this run's configuration: [(target, PASS|MISS|n/a, detail)]."""
    out = []
    perf = res.get("perf", [])
    fixed = [r for r in perf if r["kind"] in ("fixed270", "fixed270_ensemble")]  # 270-pair queries, either way
    # with every row in HBM the verdicts are perf_analyzer's (every shape of query it sent), the
    # stream client's figure beside them; with a cache they are the endless stream's: its fresh
    # keys run the cache at its stationary hit rate, where perf_analyzer's repeating pool fits
    # in the cache (a hit rate near 1.0) and is no verdict on it
    # large requests count for the rate: MLPerf measures throughput in its Offline scenario, where
    # the system batches the samples as it likes (docs/performance.md); the latency target keeps
    # its 270-pair queries
    served = [r for r in perf if r["kind"] in ("fixed270", "fixed270_ensemble", "mlperf", "big")]
    lookup = [r for r in perf if r["kind"] == "lookup"]
    ref_pairs, ref_lookups = reference_best(res)
    top = best(served, "pairs_per_s")
    stream_top = best(res.get("stream", []), "pairs_per_s")
    beside = ("" if stream_top is None else
              f"; beside it, our endless-stream client: {stream_top['pairs_per_s'] / 1e6:.2f} M pairs/s "
              f"(concurrency {stream_top['concurrency']})")
    capi_top = best([r for r in perf if r["kind"] == "fixed270_capi"], "pairs_per_s")
    if capi_top:  # not a verdict: no network front end in the path
        beside += (f"; in-process through Triton's C API (no gRPC, not judged): {capi_top['pairs_per_s'] / 1e6:.2f} M "
                   f"pairs/s (concurrency {capi_top['concurrency']}, p99 {capi_top['p99_ms']:.1f} ms)")
    scale_note = "" if setup["scale"] >= 1.0 else f" (this run: scale {setup['scale']}, not the target's 1.0)"

    def verdict(ok):
        return "n/a" if ok is None else ("PASS" if ok else "MISS")

    if setup["cache"] >= 1.0:
        out.append(("served >= 10 M pairs/s, every row in HBM (perf_analyzer)" + scale_note,
                    verdict(None if top is None else top["pairs_per_s"] >= 10e6),
                    ("-" if top is None else f"{top['pairs_per_s'] / 1e6:.2f} M pairs/s ({KIND_LABEL[top['kind']]}, "
                                             f"concurrency {top['concurrency']})") + beside))
        ratio = None if top is None or not ref_pairs else top["pairs_per_s"] / ref_pairs
        stream_ratio = ("" if stream_top is None or not ref_pairs else
                        f"; the stream client's {stream_top['pairs_per_s'] / ref_pairs:.2f}x")
        out.append((">= 1.7x the bare PyTorch reference (same call)", verdict(None if ratio is None else ratio >= 1.7),
                    "-" if ratio is None else f"{ratio:.2f}x ({top['pairs_per_s'] / 1e6:.2f} / {ref_pairs / 1e6:.2f} "
                                              f"M pairs/s){stream_ratio}"))
        fast = [r for r in fixed if r["pairs_per_s"] >= 8e6]
        ok = [r for r in fast if r["p99_ms"] <= P99_BOUND_MS]
        if ok:
            r = max(ok, key=lambda r: r["pairs_per_s"])
            detail = f"p99 {r['p99_ms']:.1f} ms at {r['pairs_per_s'] / 1e6:.2f} M pairs/s (concurrency {r['concurrency']})"
        elif fast:
            r = min(fast, key=lambda r: r["p99_ms"])
            detail = f"lowest p99 at >= 8 M pairs/s: {r['p99_ms']:.1f} ms (concurrency {r['concurrency']})"
        else:
            detail = "no 270-pair run reached 8 M pairs/s"
        out.append(("270-pair queries: p99 <= 60 ms at >= 8 M pairs/s" + scale_note,
                    verdict(None if not fixed else bool(ok)), detail))
    else:
        pool = ("" if top is None else
                f"; beside it, perf_analyzer's repeating pool (it fits in the cache: no verdict on it): "
                f"{top['pairs_per_s'] / 1e6:.2f} M pairs/s ({KIND_LABEL[top['kind']]}, concurrency {top['concurrency']})")
        small = [r for r in res.get("stream", []) if 0 < r.get("batch", 0) <= 270]
        large = [r for r in res.get("stream", []) if r not in small]
        if small:
            # queries of MLPerf's size (issue 66: p99 <= 60 ms at >= 5 M pairs/s), judged as such
            fast = [r for r in small if r["pairs_per_s"] >= 5e6]
            ok = [r for r in fast if r["p99_ms"] <= P99_BOUND_MS]
            r = (max(ok, key=lambda r: r["pairs_per_s"]) if ok else
                 min(fast, key=lambda r: r["p99_ms"]) if fast else max(small, key=lambda r: r["pairs_per_s"]))
            out.append((f"{r['batch']}-pair queries: p99 <= 60 ms at >= 5 M pairs/s with {setup['cache']:.0%} of the "
                        f"rows in the GPU cache (the endless stream of fresh keys)" + scale_note,
                        verdict(bool(ok)),
                        f"{r['pairs_per_s'] / 1e6:.2f} M pairs/s at p99 {r['p99_ms']:.1f} ms "
                        f"(concurrency {r['concurrency']})"))
        if large or not small:
            stream_top = best(large, "pairs_per_s")
            out.append((f">= 6 M pairs/s with {setup['cache']:.0%} of the rows in the GPU cache (the endless stream of "
                        f"fresh keys)" + scale_note,
                        verdict(None if stream_top is None else stream_top["pairs_per_s"] >= 6e6),
                        ("no endless stream ran" if stream_top is None else
                         f"{stream_top['pairs_per_s'] / 1e6:.2f} M pairs/s (concurrency {stream_top['concurrency']})")
                        + pool))
        rate, where = measured_hit_rate(res)
        stationary = setup["cache_plan"]["stationary"]
        gap = None if rate is None else rate - stationary
        out.append((f"hit rate within 0.002 of the stationary rate (alpha {setup['alpha']})",
                    verdict(None if gap is None else abs(gap) <= 0.002),
                    "-" if gap is None else f"measured {rate:.4f} ({where}), stationary {stationary:.4f}, "
                                            f"gap {gap:+.4f}; an LRU cache's rate on the endless stream "
                                            f"(Che's approximation): {setup['cache_plan']['lru']:.4f}"))
    top_lookup = best(lookup, "lookups_per_s")
    out.append((">= 6 G lookups/s, the pooled lookup alone (served)" + scale_note,
                verdict(None if top_lookup is None else top_lookup["lookups_per_s"] >= 6e9),
                "-" if top_lookup is None else
                f"{top_lookup['lookups_per_s'] / 1e9:.2f} G lookups/s, {top_lookup['lookups_per_s'] * 256 / 1e12:.2f} TB/s "
                f"of rows (concurrency {top_lookup['concurrency']})"
                + ("" if not ref_lookups else f"; the reference's {ref_lookups / 1e9:.2f} G lookups/s")))
    return out


def ratios(res):
    """Printed lines: served over the reference, pairs/s and the lookup alone."""
    ref_pairs, ref_lookups = reference_best(res)
    perf = res.get("perf", [])
    lines = []
    for kind in ("fixed270", "mlperf", "big", "stream", "fixed270_capi"):
        rows = [r for r in perf + res.get("stream", []) if r["kind"] == kind]
        top = best(rows, "pairs_per_s")
        if top and ref_pairs:
            lines.append(f"served / reference, pairs/s ({KIND_LABEL[kind]}, best at concurrency {top['concurrency']}): "
                         f"{top['pairs_per_s'] / 1e6:.2f} / {ref_pairs / 1e6:.2f} M = {top['pairs_per_s'] / ref_pairs:.2f}")
    top = best([r for r in perf if r["kind"] == "lookup"], "lookups_per_s")
    if top and ref_lookups:
        lines.append(f"served / reference, the pooled lookup alone: {top['lookups_per_s'] / 1e9:.2f} / "
                     f"{ref_lookups / 1e9:.2f} G lookups/s = {top['lookups_per_s'] / ref_lookups:.2f}")
    return lines


# ------------------------------------------------------------------ tables

def dle_table(rows, ref_pairs):
    """DeepLearningExamples' Triton report columns (ms), then ours."""
    cols = ["Batch", "Concurrency", "Inferences/Second", *PARTS, "p50 latency", "p90 latency", "p95 latency",
            "p99 latency", "avg latency", "pairs/s", "queries/s", "G lookups/s", "hit rate", "pairs per execution",
            "served/reference", "perf_analyzer calls"]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
    for r in rows:
        c = r["csv"]
        cells = [str(r["batch"]), str(r["concurrency"]), f"{c['Inferences/Second']:,.1f}"]
        cells += [f"{c[k] / 1e3:.3f}" for k in PARTS + PCTS]
        cells.append(f"{r['avg_ms']:.3f}")
        cells += [f"{r['pairs_per_s']:,.0f}", f"{r['queries_per_s']:,.0f}", f"{r['lookups_per_s'] / 1e9:.2f}",
                  "-" if r.get("hit_rate") is None else f"{min(r['hit_rate'], 1.0):.4f}",
                  "-" if not r.get("pairs_per_execution") else f"{r['pairs_per_execution']:,.0f}",
                  f"{r['pairs_per_s'] / ref_pairs:.2f}" if ref_pairs and r["kind"] != "lookup" else "-",
                  calls(r) or "sync"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def stream_table(rows, ref_pairs):
    cols = ["Batch", "Concurrency", "pairs/s", "queries/s", "G lookups/s", "p50", "p90", "p95", "p99", "hit rate",
            "expected hit rate", "pool (queries, GB)", "served/reference"]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
    for r in rows:
        out.append("| " + " | ".join([
            str(r["batch"]), str(r["concurrency"]), f"{r['pairs_per_s']:,.0f}", f"{r['queries_per_s']:,.0f}",
            f"{r['lookups_per_s'] / 1e9:.2f}", *(f"{r[k]:.2f}" for k in ("p50_ms", "p90_ms", "p95_ms", "p99_ms")),
            "-" if r.get("hit_rate") is None else f"{min(r['hit_rate'], 1.0):.4f}", f"{r['expected_hit_rate']:.4f}",
            f"{r['pool_queries']:,}, {r['pool_gb']:.1f}", f"{r['pairs_per_s'] / ref_pairs:.2f}" if ref_pairs else "-"]) + " |")
    return "\n".join(out)


def reference_table(ref, peak):
    cols = ["batch (pairs)", "lookup ms", "G lookups/s", "GB/s of rows", "network ms", "TFLOP/s", "% of peak",
            "both ms", "pairs/s"]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
    for b, x in sorted(ref["batches"].items(), key=lambda kv: int(kv[0])):
        out.append("| " + " | ".join([
            f"{int(b):,}", f"{x['lookup_s'] * 1e3:.3f}", f"{x['lookups_per_s'] / 1e9:.2f}", f"{x['row_gb_per_s']:.0f}",
            f"{x['net_s'] * 1e3:.3f}", f"{x['tflops']:.0f}", f"{100 * x['tflops'] / peak:.0f}%",
            f"{x['both_s'] * 1e3:.3f}", f"{x['pairs_per_s']:,.0f}"]) + " |")
    return "\n".join(out)


# ------------------------------------------------------------------ plots

def draw(ax, rows, kind, key, unit):
    """`kind`'s lines of `key` (in `unit`s) against the queries in flight; returns those."""
    concs = set()
    for label, style, color, sel in series(rows, kind):
        pts = sorted((r["concurrency"], r[key]) for r in sel)
        ax.plot([c for c, _ in pts], [v / unit for _, v in pts], style, color=color, label=label)
        concs |= {c for c, _ in pts}
    return concs


def plot_throughput(plt, setup, res, gpu, out):
    ref_pairs, ref_lookups = reference_best(res)
    rows = res.get("perf", []) + res.get("stream", [])
    # the lookup's panel only where a run measured it
    if any(r["kind"] == "lookup" for r in rows):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    else:
        fig, ax1 = plt.subplots(figsize=(8, 4.8))
        ax2 = None
    concs, lookup_concs = set(), set()
    for kind in ("fixed270", "fixed270_ensemble", "mlperf", "stream", "big", "fixed270_capi"):
        concs |= draw(ax1, rows, kind, "pairs_per_s", 1e6)
    if ref_pairs:
        ax1.axhline(ref_pairs / 1e6, color="gray", ls="-.",
                    label=f"bare PyTorch reference, lookup + network ({ref_pairs / 1e6:.2f} M)")
    goal = 10e6 if setup["cache"] >= 1.0 else 6e6
    ax1.axhline(goal / 1e6, color="tab:red", ls=":", label=f"target {goal / 1e6:.0f} M pairs/s")
    ax1.set(xscale="log", xlabel="concurrent client requests (queries in flight)", ylabel="M pairs / second",
            title="DLRM-v2 served: pairs/s")
    if ax2 is not None:
        lookup_concs |= draw(ax2, rows, "lookup", "lookups_per_s", 1e9)
        if ref_lookups:
            ax2.axhline(ref_lookups / 1e9, color="gray", ls="-.",
                        label=f"bare PyTorch F.embedding_bag ({ref_lookups / 1e9:.2f} G)")
        ax2.axhline(6.0, color="tab:red", ls=":", label="target 6 G lookups/s")
        ax2.set(xscale="log", xlabel="concurrent client requests (270 pairs each)", ylabel="G lookups / second",
                title="the pooled lookup alone")
    for ax, ticks in ((ax1, concs), (ax2, lookup_concs)):
        if ax is None:
            continue
        if ticks:
            ax.set_xticks(sorted(ticks), [str(c) for c in sorted(ticks)])
            ax.set_xticks([], minor=True)  # a log axis's minor labels (2x10^1 ...) would crowd the concurrencies
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    return save(plt, fig, gpu, out, "dlrm_v2_throughput.png")


def plot_latency(plt, res, gpu, out):
    fig, ax = plt.subplots(figsize=(8, 4.8))
    rows = res.get("perf", []) + res.get("stream", [])
    for kind in ("fixed270", "fixed270_ensemble", "mlperf", "stream", "fixed270_capi"):
        for label, style, color, sel in series(rows, kind):
            pts = sorted((r["pairs_per_s"], r["p99_ms"], r["concurrency"]) for r in sel)
            ax.plot([x / 1e6 for x, _, _ in pts], [y for _, y, _ in pts], style, color=color, label=label)
            for x, y, c in pts:
                ax.annotate(f"c{c}", (x / 1e6, y), textcoords="offset points", xytext=(3, 3), fontsize=7, color=color)
    ax.axhline(P99_BOUND_MS, color="tab:red", ls=":", label="MLPerf's bound, 60 ms")
    ax.axvline(8.0, color="tab:red", ls="--", alpha=0.5, label="8 M pairs/s")
    ax.set(yscale="log", xlabel="M pairs / second", ylabel="p99 latency per query (ms)",
           title="DLRM-v2 served: p99 per query against throughput")
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(plt, fig, gpu, out, "dlrm_v2_latency.png")


# ------------------------------------------------------------------ README

def write(out, setup, res, plots=True):
    """README.md (and the plots, unless `plots` is off) in `out`; returns the README's path."""
    prec = setup.get("network_precision", "fp16")
    net_form = ("a CUDA fp16 AOTInductor package" if prec == "fp16" else
                "a CUDA AOTInductor package in fp16 with its large linear layers in FP8 e4m3 (examples/fp8.py, "
                "per-tensor scales, the inputs' calibrated)")
    modes = setup.get("pa_modes", ["sync"])
    http = [m for m in modes if m in HTTP_MODES]
    proto = ("gRPC streaming" if setup.get("pa_streaming") else "HTTP" if http == modes else
             "gRPC and HTTP" if http else "gRPC")
    grpc = f"{proto} ({' and '.join(modes)} calls)"
    gpu_line = f"{setup['gpu']}; perf_analyzer {grpc}, CUDA shared memory; {setup.get('cache_rows', 'fp16')} rows, {prec} network"
    files = []
    if plots:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        files = [plot_throughput(plt, setup, res, gpu_line, out), plot_latency(plt, res, gpu_line, out)]
    ref_pairs, _ = reference_best(res)
    perf = res.get("perf", [])
    plan = setup["cache_plan"]
    md = [f"# MLPerf DLRM-v2 served through tritonserver — {setup['gpu'].split(',')[0]}", "",
          "Written by `bench/gpu/dlrm_v2_perf.py` (`bench/gpu/dlrm_v2_report.py` writes it again from `setup.json` and "
          "`runs.json`); the raw perf_analyzer CSVs, the key pools' descriptions and the server log's end are in "
          "`perf.tgz`, everything printed in `console.log`, the host in `host.txt`. Latencies in ms, per query.", "",
          f"Command: `{setup['command']}`", "",
          f"GPU: {setup['gpu']} (driver {setup['driver']}); torch {setup['torch']}; {setup['date']}.", "",
          "## What was run", "",
          f"- Tables: MLPerf DLRM-v2's 26 tables at scale {setup['scale']} ({setup['rows']:,} rows of dim 128, "
          f"{setup['parameters'] / 1e9:.1f} B parameters, {setup['table_gb']:.1f} GB fp16), written by `criteo_fixture` "
          f"(keys 0..rows, rows computed from its seed) in `{setup['fixture']}`; 214 lookups per pair "
          "(hotness 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1), every bag full, sum-pooled.",
          f"- `dlrm_v2`: one recommender model (examples/dlrm_v2.py's config), {setup['instances']} KIND_GPU instances{' on each of GPUs ' + setup['gpus'] if setup.get('gpus') else ''}, "
          f"dynamic batching (max_queue_delay {setup['max_queue_delay_us']} us, max_batch_size {setup['max_batch']} pairs), "
          f"GPU cache `gpucacheper` {setup['cache']} (`gpucache_allocation` {setup['allocation']}, "
          f"`gpucache_policy` {setup.get('cache_policy', 'lru')}, misses read by the {setup.get('miss_reads', 'cpu')} "
          f"(`gpucache_miss_reads`), "
          f"{'the tables spread over the GPUs (gpucache_placement sharded)' if setup.get('placement') == 'sharded' else 'one cache per GPU'}, "
          f"{setup.get('cache_rows', 'fp16')} rows: {setup['cached_rows']:,} slots), pooled rows into the network as fp16; the network DCNv2's dense "
          f"part as {net_form} (cross layers `{setup['dcnv2_cross']}`), CUDA graphs for batches of "
          f"{setup['graph_batches']} pairs (a batch runs in the smallest graph holding it).",
          "- `dlrm_v2_lookup`: the embedding engine alone on the same store (`store_name` shared: the rows are in "
          "memory once), pooled interface, fp16 output [26, 128]: the pooled lookup alone, served.",
          f"- `dlrm_v2_queries`: a non-batching ensemble ({{dense [-1, 13], sparse [-1, 214]}} -> prediction [-1, 1]) "
          "whose one step is `dlrm_v2`: perf_analyzer sends each query with its own number of pairs (-b cannot vary in "
          "one run), and `dlrm_v2`'s dynamic batcher still batches the queries together. One ensemble hop per query.",
          f"- Keys: per table Zipf of exponent {setup['alpha']} over its rows, hot keys spread over the key space "
          "(bench/gpu/zipf_keys.py). perf_analyzer cycles pools of distinct requests: "
          + "; ".join(setup["pools"][k] for k in ("fixed270", "mlperf", "big") if k in setup["pools"]) + ".",
          f"- MLPerf's query sizes: {setup['mlperf_sizes_note']}",
          f"- The endless stream: {stream_note(setup, res)}",
          "- The bare PyTorch reference, in the same call after the server stopped: every table in HBM as an fp16 "
          "tensor of the same rows (random values), `F.embedding_bag` (sum, full bags) per table then stacked to "
          f"[B, 26, 128], the DCNv2 network in fp16 compiled by `torch.compile(mode=\"{(res.get('reference') or {}).get('mode', '-')}\")`, "
          "timed with CUDA events, keys already on the GPU (the same Zipf law).", ""]
    md += ["## Targets (issue 46)", "", "| target | verdict | figure |", "|---|---|---|"]
    md += [f"| {t} | **{v}** | {d} |" for t, v, d in targets(setup, res)] + [""]
    lines = ratios(res)
    if lines:
        md += ["Ratios: " + "; ".join(lines) + ".", ""]
    if setup["cache"] < 1.0:
        md += [f"Hit rates (alpha {setup['alpha']}, each table's lookups weighted by its hotness): a cache holding each "
               f"table's hottest keys on an endless stream (stationary) {plan['stationary']:.4f}; an LRU cache on the "
               f"endless stream (Che's approximation) {plan['lru']:.4f}. perf_analyzer's pools repeat and fit in the "
               "cache: their measured rates are above both.", ""]
    for kind, title in (("fixed270", "270-pair queries: perf_analyzer -b 270 on dlrm_v2"),
                        ("fixed270_ensemble", "270-pair queries through the twin"),
                        ("mlperf", "MLPerf-like query sizes through the twin"),
                        ("lookup", "The pooled lookup alone: dlrm_v2_lookup"),
                        ("probe1", "One-pair queries: perf_analyzer -b 1 on dlrm_v2"),
                        ("big", "Large requests (MLPerf's Offline shape) through the twin"),
                        ("fixed270_capi", "270-pair queries in-process: perf_analyzer through Triton's C API")):
        rows = sorted([r for r in perf if r["kind"] == kind], key=lambda r: r["concurrency"])
        if rows:
            note = {"fixed270": "Inferences/Second is pairs/s (one perf_analyzer inference is one pair).",
                    "fixed270_ensemble": "Inferences/Second is queries/s (one request per query).",
                    "mlperf": "Inferences/Second is queries/s; pairs/s = queries/s x the pool's mean pairs per query.",
                    "lookup": "Inferences/Second is pairs/s; each pair is 214 lookups.",
                    "big": "Inferences/Second is requests/s; pairs/s = requests/s x the pairs of one request. "
                           "Each request holds several users' pairs, as MLPerf's Offline scenario lets the system "
                           "batch them, so the queries a second through the front end do not hold the rate.",
                    "probe1": "Inferences/Second is queries/s of one pair each: what the server gives per query when "
                              "the GPU has next to nothing to do.",
                    "fixed270_capi": "Inferences/Second is pairs/s. perf_analyzer ran Triton's library and this "
                                     "backend in its own process (`--service-kind triton_c_api`) on the same "
                                     "repository after tritonserver stopped: the same scheduler, dynamic batcher and "
                                     "backend, no gRPC front end. Its inputs lie in shared memory of the kind the "
                                     "last column names (CUDA: GPU memory, as over gRPC; system: host memory, "
                                     "which the backend copies up). Not judged against the targets, which are "
                                     "for a server over the network."}[kind]
            if kind == "big":
                note += f" Here {rows[0]['batch']:,} pairs a request."
            md += [f"## {title}", "", note + " `pairs per execution`: the batches the dynamic batcher formed "
                   "(Triton's statistics, the whole perf_analyzer call).", "", dle_table(rows, ref_pairs), ""]
            again = [r for r in rows if r.get("retried")]
            if again:
                md += ["Run a second time because perf_analyzer lost gRPC connections in the first (the figure is the "
                       "second's): " + ", ".join(f"concurrency {r['concurrency']} ({r.get('pa_mode', 'sync')} calls)"
                                                 for r in again) + ".", ""]
            loose = [r for r in rows if r.get("stability_pct", 10) > 10]
            if loose:
                md += ["Measured with perf_analyzer's stability bound loosened: " + ", ".join(
                    f"concurrency {r['concurrency']} (-s {r['stability_pct']})" for r in loose) + ".", ""]
    clients = sorted([r for r in perf if r["kind"] == "probe1_clients"], key=lambda r: r["clients"])
    if clients:
        md += ["## One-pair queries from several perf_analyzer processes at once", "",
               "Async calls, inputs in the requests' bodies (two processes cannot share the server's shared memory), "
               "the queries in flight split among the processes. If the sum grows with the processes, one client "
               "was the limit; if it stays, the server is.", "",
               "| processes | in flight | queries/s, all | each | worst p99 (ms) |", "|---:|---:|---:|---|---:|"]
        md += [f"| {r['clients']} | {r['concurrency']} | {r['queries_per_s']:,.0f} | "
               f"{', '.join(f'{x:,.0f}' for x in r['per_client_queries_per_s'])} | {r['p99_ms']:.2f} |" for r in clients]
        md.append("")
    stream = sorted(res.get("stream", []), key=lambda r: r["concurrency"])
    if stream:
        md += [f"## Queries of {stream[0].get('batch', 270)} pairs as an endless stream (our client, not perf_analyzer)", "",
               "examples/stream_client.rs sends queries whose keys lie in one CUDA shared-memory pool drawn on the GPU, "
               f"over HTTP; {setup.get('stream_warm_passes', 1)} pass(es) of the pool warm the cache, the measured "
               "passes follow" + ("; the pool is drawn again (new keys, the same law) before every pass, so no query "
                                  "repeats and the expected hit rate is the policy's on an endless stream"
                                  if setup.get("stream_fresh") else "") + ". Latency measured at the client.", "", stream_table(stream, ref_pairs), ""]
    ref = res.get("reference")
    if ref and ref.get("batches"):
        md += ["## The bare PyTorch reference", "",
               f"Network: {ref['flops_per_pair'] / 1e6:.2f} MFLOP of matrix products per pair (2 x in x out over its "
               f"{ref['linear_layers']} linear layers), {ref['peak_tflops']:.0f} TFLOP/s taken as the fp16 tensor peak. "
               f"Compiled in {ref['compile_seconds']:.0f} s ({ref['mode']})."
               + (f" {ref['note']}" if ref.get("note") else ""), "",
               reference_table(ref, ref["peak_tflops"]), ""]
    ex = res.get("exactness") or {}
    if ex:
        md += ["## Exactness (before the timed runs)", ""]
        if "lookup" in ex:
            e = ex["lookup"]
            md.append(f"- `dlrm_v2_lookup`: {e['pooled_rows']:,} pooled rows of {e['requests']} requests of 270 pairs "
                      f"against a float64 sum of the fixture's rows (recomputed from its seed): max abs diff "
                      f"{e['max_abs_diff']:.3g}, bound |diff| <= {e['atol']} + {e['rtol']} x |sum| (fp16 rounding of "
                      f"the result): {e['bad_values']} values outside.")
        if "prediction" in ex:
            e = ex["prediction"]
            md.append(f"- `dlrm_v2`: {e['predictions']:,} predictions against the PyTorch fp32 network (the weights "
                      f"the package was exported from) on the float64-summed rows: max abs diff {e['max_abs_diff_fp32']:.3g} "
                      f"(bound {e['bound']}); against the same network in {prec} on fp16 pooled rows: "
                      f"{e['max_abs_diff_fp16']:.3g}.")
        for f in ex.get("failures", []):
            md.append(f"- **FAIL** {f}")
        md.append("")
    phases = setup.get("phases") or {}
    if phases:
        md += ["## Where the call's time went", "",
               ", ".join(f"{k} {v:.0f} s" for k, v in phases.items()) + ".", ""]
    md += host_section(res)
    md += [f"![{f}]({f})" for f in files] + [""]
    path = os.path.join(out, "README.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    return path


def host_section(res):
    """The host's CPU during each run (runs.json's `cpu`, where the run recorded it): is the host,
    the server or one of its threads the limit?"""
    runs = [r for r in res.get("perf", []) + res.get("stream", []) if r.get("cpu")]
    if not runs:
        return []
    md = ["## The host during each run", "",
          "From /proc: the host's CPUs busy, the cores tritonserver used and the client used (perf_analyzer or "
          "stream_client), and the server's three busiest threads (cores each; one near 1.00 is a serial limit).", "",
          "| run | concurrency | pairs/s | host busy | tritonserver cores | client cores | busiest server threads |",
          "|---|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        c = r["cpu"]
        threads = ", ".join(f"{n} {cores:.2f}" for n, cores in c.get("busiest_server_threads", [])[:3]) or "-"
        mode = f" ({calls(r, ' calls')})" if r.get("pa_mode") else ""
        inside = r.get("pa_mode") == "capi"  # Triton ran in perf_analyzer's process: its cores are the client's
        server = "in perf_analyzer" if inside else f"{c['server_cores']:.1f}"
        md.append(f"| {r['kind']}{mode} | {r['concurrency']} | {r['pairs_per_s'] / 1e6:.2f} M | "
                  f"{c['host_busy_pct']:.0f}% of {c['cpus']} | {server} | {c['client_cores']:.1f} | {threads} |")
    return md + [""]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", required=True, help="a results folder of dlrm_v2_perf.py (setup.json, runs.json)")
    p.add_argument("--out", default="", help="where README.md and the plots go (default: --results)")
    p.add_argument("--no-plots", action="store_true")
    a = p.parse_args()
    with open(os.path.join(a.results, "setup.json")) as f:
        setup = json.load(f)
    with open(os.path.join(a.results, "runs.json")) as f:
        res = json.load(f)
    out = a.out or a.results
    os.makedirs(out, exist_ok=True)
    print(f"wrote {write(out, setup, res, plots=not a.no_plots)}")
    for t, v, d in targets(setup, res):
        print(f"{v:4s} {t}: {d}")


if __name__ == "__main__":
    main()
