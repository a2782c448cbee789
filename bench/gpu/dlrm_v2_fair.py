#!/usr/bin/env python3
"""Fair ratios for MLPerf DLRM-v2 (issue 65, point 3): the served model against a bare PyTorch
reference of the same precision and the same overlap, all in ONE device call:

    bash bench/gpu/run.sh dlrm-v2-fair [options]        (carry .carry and .carry_pa)

For each precision of --precisions (default fp8,fp16), at one batch (--batch, 16,384 pairs):

  served     bench/gpu/dlrm_v2_perf.py as the headline run uses it (every row in HBM, fp16 rows,
             the network an AOTInductor package with the cross layers as our Triton kernels,
             --instances KIND_GPU instances, CUDA graphs, dynamic batching), in MLPerf's Offline
             shape: requests of --big-pairs pairs (8,192; two make one execution of 16,384),
             perf_analyzer (gRPC sync, CUDA shared memory) at --big-concurrency and the endless
             stream (examples/stream_client.rs) at --stream-concurrency; its exactness check gives
             the served predictions' max |diff| against the PyTorch fp32 network.
  reference  the same network module the package is exported from (same precision, same Triton
             cross-layer kernels), torch.compile'd (default mode, static shapes) and run as CUDA
             graphs, plus the bare pooled lookup: F.embedding_bag (sum) over the same 26 fp16
             tables at --scale (1.0: 204 M rows, 52 GB in HBM), stacked to [batch, 26, 128].
             Timed by CUDA events: the network alone, the lookup alone, lookup then network one
             after the other on one stream, and overlapped on S CUDA streams (--streams, each
             stream replaying its own graphs of lookup + network, several batches in flight as
             the served instances are), and the ideal overlap batch / max(lookup, network).
             Accuracy: the timed network graph on the served exactness check's 4,320 pairs (the
             same keys: dlrm_v2_perf.draw_pairs, seed 46), their rows pooled by F.embedding_bag
             from the fixture's own rows, against the PyTorch fp32 network on the float64 sums.
  package    the served package's network alone, its CUDA-graph replays by bench/gpu/aoti_bare.

Phases (one call; the device's limit is 600 s): the fixture (criteo_fixture into /dev/shm) and
the packages' exports (one child process each, at once), then the first precision served, the
references of all precisions, the other precisions served, the packages alone, the report. A
served run reuses the package exported for it (recsys.networks.export_aoti's key). Ratios
served / reference for each precision, network TFLOP/s against that precision's dense peak
(H100/H200 SXM: 989 fp16, 1979 FP8), the accuracy beside every figure.

Writes --results: README.md (table, plot), results.json, fair.png, call.tgz (run.sh's host.txt,
moved in; --work's gpu_dmon.log where run.sh's nvidia-smi dmon writes it; both served runs' own
folders); run.sh adds console.log. Five files: the results tree keeps few (its README).

Also:  --report-only DIR   the README and plot again from DIR/results.json
       --device cpu        the reference phase alone on the CPU at a small --scale (a test of the
                           code path: no streams, no graphs, no compile, fp16/fp32 only)
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))

T0 = time.time()
HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]  # dlrm_v2.HOTNESS
DIM = 128
TABLES = 26
EXACT_PAIRS = 16 * 270  # dlrm_v2_perf's exactness check: 16 requests of 270 pairs (seed 46)
# dense tensor peaks, TFLOP/s (NVIDIA's datasheets; the H200 SXM is the H100 SXM's chip)
PEAKS = [("H100 PCIe", {"fp16": 756.0, "fp8": 1513.0}), ("H100 NVL", {"fp16": 835.0, "fp8": 1671.0}),
         ("H200 NVL", {"fp16": 835.0, "fp8": 1671.0}), ("H100", {"fp16": 989.0, "fp8": 1979.0}),
         ("H200", {"fp16": 989.0, "fp8": 1979.0})]
DEFAULT_PEAK = {"fp16": 989.0, "fp8": 1979.0}
# seconds a phase is expected to take (the driver keeps room for the phases after the one it starts)
SERVED_S = 115             # a served run: its start and pools, the server's load, exactness, stream, 2 perf_analyzer runs
REFERENCE_S = lambda n: 30 + 40 * n  # noqa: E731 - the reference: inputs, tables, then each network
PACKAGE_S = 15             # aoti_bare on one package


def log(msg):
    print(msg, flush=True)


def phase(name):
    log(f"[{time.strftime('%H:%M:%S')} +{time.time() - T0:4.0f} s] == {name}")


def peaks_for(gpu):
    for key, p in PEAKS:
        if key in gpu:
            return dict(p), key
    return dict(DEFAULT_PEAK), "H100 SXM (the GPU's own not known here)"


# ------------------------------------------------------------------ arguments

def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="")
    p.add_argument("--backends", default="")
    p.add_argument("--perf-analyzer", default="")
    p.add_argument("--fixture-bin", default=os.path.join(ROOT, ".carry", "criteo_fixture"))
    p.add_argument("--stream-client", default=os.path.join(ROOT, ".carry", "stream_client"))
    p.add_argument("--aoti-bare", default="/tmp/aoti_bare", help="bench/gpu/aoti_bare.cpp's binary (absent: no package figure)")
    p.add_argument("--libtorch-dir", default="")
    p.add_argument("--results", default=os.path.join(os.environ.get("OUT", "/tmp/out"), "dlrm-v2-fair"))
    p.add_argument("--work", default="/tmp/dlrm_v2_fair")
    p.add_argument("--command", default="", help="the command line to record (run.sh passes its own)")
    p.add_argument("--precisions", default="fp8,fp16", help="network precisions, each served and referenced")
    p.add_argument("--cross", default="triton", choices=["triton", "torch"],
                   help="DCNv2's cross layers in both the served package and the reference module")
    p.add_argument("--scale", type=float, default=1.0, help="MLPerf's rows times this (1.0: 204 M rows, 52 GB fp16)")
    p.add_argument("--batch", type=int, default=16384, help="pairs of the reference's batch and the served max_batch_size")
    p.add_argument("--instances", type=int, default=6, help="the served model's KIND_GPU instances")
    p.add_argument("--big-pairs", type=int, default=8192, help="pairs of one served request (MLPerf's Offline shape)")
    p.add_argument("--big-concurrency", default="8,24", help="perf_analyzer's requests in flight (the headline's: 8)")
    p.add_argument("--stream-concurrency", default="24", help="the endless stream's requests in flight (0: none)")
    p.add_argument("--served-budget-s", type=float, default=150.0, help="dlrm_v2_perf.py's --budget-s for each served run")
    p.add_argument("--served-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for every dlrm_v2_perf.py run (repeatable)")
    p.add_argument("--streams", default="2,3,6", help="the reference's CUDA streams when overlapped")
    p.add_argument("--iters", type=int, default=120, help="the reference's batches per timed window")
    p.add_argument("--repeats", type=int, default=3, help="timed windows per figure (the median kept)")
    p.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of every table's keys (as served)")
    p.add_argument("--deadline-s", type=float, default=550.0,
                   help="phases that would not end by this many seconds from the start are skipped (printed)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the reference phase alone, a test")
    p.add_argument("--skip-served", action="store_true", help="no served runs (the reference and packages only)")
    p.add_argument("--report-only", default="", metavar="DIR", help="README.md and fair.png again from DIR/results.json")
    # the workers this script starts
    p.add_argument("--export-worker", nargs=3, metavar=("PRECISION", "WORK", "MAX_BATCH"), help=argparse.SUPPRESS)
    p.add_argument("--reference-worker", metavar="JSON", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.precision_list = [x.strip() for x in a.precisions.split(",") if x.strip()]
    if not a.precision_list or any(x not in ("fp8", "fp16") for x in a.precision_list):
        p.error(f"--precisions: a comma list of fp8 and fp16, not {a.precisions!r}")
    ints = lambda s: [int(x) for x in str(s).split(",") if x.strip() and int(x) > 0]  # noqa: E731
    a.stream_list, a.big_list, a.served_streams = ints(a.streams), ints(a.big_concurrency), ints(a.stream_concurrency)
    if not a.stream_list:
        p.error("--streams: at least one number of streams")
    if a.batch % a.big_pairs:
        p.error("--batch must be a multiple of --big-pairs (the served executions are whole requests)")
    if a.device == "cpu" and "fp8" in a.precision_list and a.reference_worker is None and not a.report_only:
        p.error("--device cpu: FP8 needs a GPU (--precisions fp16)")
    if (not a.report_only and a.reference_worker is None and a.export_worker is None and a.device == "cuda"
            and not a.skip_served and not (a.server and a.backends and a.perf_analyzer)):
        p.error("the served runs need --server, --backends and --perf-analyzer (run.sh passes them)")
    a.command = a.command or " ".join([os.path.relpath(sys.argv[0], ROOT)] + (argv if argv is not None else sys.argv[1:]))
    return a


# ------------------------------------------------------------------ the packages

def export_namespace(precision, cross, work):
    """The settings dlrm_v2_perf.py's tables_and_network exports its package with (so that its export_aoti call
    finds this package and reuses it: the same key)."""
    import dlrm_v2
    return SimpleNamespace(precision=precision, aoti_dlrm_interaction="triton", dcnv2_cross=cross, example_batch=0,
                           work=work, inductor=[], cross_config="", dim=DIM,
                           calibration=dlrm_v2.calibration_inputs() if precision == "fp8" else None)


def export_worker(a):
    precision, work, max_batch = a.export_worker
    os.makedirs(work, exist_ok=True)
    from recsys.networks import export_aoti
    t0 = time.time()
    path = export_aoti("dcnv2", export_namespace(precision, a.cross, work), "TYPE_FP16", int(max_batch))
    log(f"  export {precision}: {path} in {time.time() - t0:.0f} s")
    return 0


def package_path(work):
    return os.path.join(work, "dcnv2_dense.pt2")  # recsys.networks.export_aoti's path


# ------------------------------------------------------------------ served

def served_command(a, precision, budget):
    graphs = ",".join(str(b) for b in range(2048, a.batch + 1, 2048)) if a.batch >= 2048 else str(a.batch)
    cmd = [sys.executable, os.path.join(HERE, "dlrm_v2_perf.py"),
           "--server", a.server, "--backends", a.backends, "--perf-analyzer", a.perf_analyzer,
           "--fixture-bin", a.fixture_bin, "--stream-client", a.stream_client,
           "--results", os.path.join(a.work, f"served_{precision}"), "--work", os.path.join(a.work, precision),
           "--scale", str(a.scale), "--max-batch", str(a.batch),
           "--network-precision", precision, "--dcnv2-cross", a.cross, "--instances", str(a.instances),
           "--max-queue-delay-us", "1000", "--graph-batches", graphs,
           "--concurrency", "0", "--pa-modes", "sync", "--mlperf-concurrency", "0", "--lookup-concurrency", "0",
           "--stream-concurrency", ",".join(map(str, a.served_streams)) or "0", "--stream-pairs", str(a.big_pairs),
           "--big-concurrency", ",".join(map(str, a.big_list)) or "0", "--big-pairs", str(a.big_pairs),
           "--pa-timeout-s", "100", "--interval-ms", "2000", "--alpha", str(a.alpha), "--no-reference",
           "--budget-s", f"{budget:.0f}"]
    if a.libtorch_dir:
        cmd += ["--libtorch-dir", a.libtorch_dir]
    cmd += a.served_arg
    # the settings, without the machine's paths (run.sh's own)
    cmd += ["--command", "bench/gpu/dlrm_v2_perf.py (run by dlrm_v2_fair.py) "
            + " ".join(cmd[cmd.index("--scale"):cmd.index("--budget-s") + 2])]
    return cmd


def served_figures(folder):
    """The served run's figures from dlrm_v2_perf.py's runs.json and setup.json."""
    out = {"folder": os.path.basename(folder)}
    try:
        with open(os.path.join(folder, "runs.json")) as f:
            res = json.load(f)
    except (OSError, ValueError) as e:
        out["error"] = f"no runs.json: {e}"
        return out
    try:
        with open(os.path.join(folder, "setup.json")) as f:
            setup = json.load(f)
        out["export_seconds"] = setup.get("export_seconds")
        out["instances"] = setup.get("instances")
    except (OSError, ValueError):
        pass
    out["perf_analyzer"] = [{"concurrency": r["concurrency"], "pairs_per_s": r["pairs_per_s"], "p99_ms": r["p99_ms"],
                             "pairs_per_execution": r.get("pairs_per_execution"), "pa_mode": r.get("pa_mode")}
                            for r in res.get("perf", []) if r.get("kind") == "big"]
    out["stream"] = [{"concurrency": r["concurrency"], "pairs_per_s": r["pairs_per_s"], "p99_ms": r["p99_ms"],
                      "pairs": r.get("batch")} for r in res.get("stream", [])]
    ex = res.get("exactness") or {}
    if ex.get("prediction"):
        out["accuracy_fp32"] = ex["prediction"]["max_abs_diff_fp32"]
        out["accuracy_vs_module"] = ex["prediction"]["max_abs_diff_fp16"]
        out["accuracy_pairs"] = ex["prediction"]["predictions"]
    if ex.get("lookup"):
        out["lookup_max_abs_diff"] = ex["lookup"]["max_abs_diff"]
        out["lookup_bad_values"] = ex["lookup"]["bad_values"]
    out["failures"] = ex.get("failures", [])
    return out


# ------------------------------------------------------------------ the reference

def accuracy_inputs(rows, alpha, pairs):
    """The served exactness check's pairs (dlrm_v2_perf.draw_pairs, seed 46): dense [n, 13] float32,
    the float64 sums of their rows [n, 26, 128], and per table the rows the bags read, in bag order
    (float32 holding the fixture's fp16 values exactly)."""
    import numpy as np
    from dlrm_v2_perf import START, draw_pairs
    from recsys.fixture import SEED, synthetic_rows
    sparse, dense = draw_pairs(rows, pairs, alpha, seed=46)
    sums = np.empty((pairs, TABLES, DIM), np.float64)
    bag_rows = []
    for t, h in enumerate(HOT):
        r = synthetic_rows(SEED, t, sparse[:, START[t]:START[t] + h].reshape(-1), DIM)
        sums[:, t] = r.reshape(pairs, h, DIM).astype(np.float64).sum(1)
        bag_rows.append(r)
    return dense, sums, bag_rows


class Timer:
    """Batches launched on streams, timed by CUDA events (host clock on the CPU)."""

    def __init__(self, cuda):
        import torch
        self.torch, self.cuda = torch, cuda

    def stream(self):
        return self.torch.cuda.Stream() if self.cuda else None

    def run(self, lanes, rounds):
        """lanes: [(stream, [launch, ...])]; each round launches the next of each lane's launches on
        its stream. Seconds from before the first launch to the end of the last batch of every lane."""
        torch = self.torch
        if not self.cuda:
            t0 = time.perf_counter()
            for r in range(rounds):
                for _, ls in lanes:
                    ls[r % len(ls)]()
            return time.perf_counter() - t0
        main = torch.cuda.current_stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(main)
        for s, _ in lanes:
            s.wait_stream(main)
        for r in range(rounds):
            for s, ls in lanes:
                with torch.cuda.stream(s):
                    ls[r % len(ls)]()
        for s, _ in lanes:
            main.wait_stream(s)
        end.record(main)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def batches_per_s(self, lanes, total, repeats):
        """The median over `repeats` windows of batches a second, each window about `total` batches
        spread over the lanes (after one short window to warm up)."""
        rounds = max(2, total // len(lanes))
        self.run(lanes, max(2, rounds // 4))
        rates = sorted(rounds * len(lanes) / self.run(lanes, rounds) for _ in range(repeats))
        return rates[len(rates) // 2], rates


def reference_worker(a):
    """The bare PyTorch reference of every precision; writes its figures to --reference-worker."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import stream_load
    import dlrm_v2
    from recsys.fixture import SEED, fixture_rows
    from recsys.networks import dense_network, linear_flops
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    tm = Timer(cuda)
    rows = fixture_rows(a.scale)
    B = a.batch
    out = {"batch": B, "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
           "scale": a.scale, "rows": sum(rows), "table_gb": sum(rows) * DIM * 2 / 1e9, "cross": a.cross,
           "streams": a.stream_list, "iters": a.iters, "repeats": a.repeats, "cuda_graphs": cuda,
           "compiled": cuda, "precisions": {}}

    t0 = time.time()
    n_exact = min(EXACT_PAIRS, B)
    ex_dense, ex_sums, ex_rows = accuracy_inputs(rows, a.alpha, n_exact)
    with torch.no_grad():
        ex_pooled = torch.stack([F.embedding_bag(torch.arange(len(r), device=dev),
                                                 torch.from_numpy(r).to(dev).half(),
                                                 torch.arange(n_exact, device=dev) * h, mode="sum")
                                 for r, h in zip(ex_rows, HOT)], dim=1)
        ref32 = dense_network("dcnv2", "fp32", dev)
        ex_d = torch.from_numpy(ex_dense).to(dev)
        want = ref32(ex_d, torch.from_numpy(ex_sums).float().to(dev)).float()
    del ref32, ex_rows
    out["accuracy_inputs_s"] = time.time() - t0
    log(f"  accuracy inputs: the served check's {n_exact:,} pairs, their rows pooled by F.embedding_bag, the fp32 "
        f"network on their float64 sums ({time.time() - t0:.0f} s); pooled fp16 against float64: max abs diff "
        f"{float((ex_pooled.double().cpu() - torch.from_numpy(ex_sums)).abs().max()):.3g}")

    t0 = time.time()
    # values do not matter for timing; the shapes are the served tables'
    tables = [torch.empty((r, DIM), dtype=torch.half, device=dev).normal_(0.0, 0.05) for r in rows]
    offsets = [torch.arange(B, device=dev, dtype=torch.int64) * h for h in HOT]
    gen = torch.Generator(device=dev).manual_seed(SEED + 65)
    n_slots = max(4, max(a.stream_list))
    # each slot a batch of its own: keys (the served Zipf law), dense features, its graphs' buffers
    slots = [{"keys": [stream_load.torch_spread(stream_load.torch_zipf_ranks(gen, r, a.alpha, B * h, dev), r)
                       for r, h in zip(rows, HOT)],
              "dense": torch.rand(B, 13, device=dev, generator=gen)} for _ in range(n_slots)]
    if cuda:
        torch.cuda.synchronize()
    out["tables_s"] = time.time() - t0
    log(f"  {len(tables)} fp16 tables in {'HBM' if cuda else 'memory'} ({out['table_gb']:.1f} GB), {n_slots} batches "
        f"of {B:,} pairs' keys ({time.time() - t0:.0f} s)")

    def lookup(keys):
        return torch.stack([F.embedding_bag(k, w, o, mode="sum") for k, w, o in zip(keys, tables, offsets)], dim=1)

    calib = dlrm_v2.calibration_inputs()
    for prec in a.precision_list:
        x = {}
        out["precisions"][prec] = x
        t0 = time.time()
        with torch.no_grad():
            pooled0 = lookup(slots[0]["keys"])
        net = fn = None
        # the served package's form first; should its compile fail, the cross layers as written (said)
        for cross in dict.fromkeys([a.cross if cuda else "torch", "torch"]):
            torch._dynamo.reset()
            try:
                net = dense_network("dcnv2", prec, dev, cross=cross, calibration=calib if prec == "fp8" else None)
                fn = torch.compile(net, dynamic=False) if cuda else net
                with torch.no_grad():
                    fn(slots[0]["dense"], pooled0)
                if cuda:
                    torch.cuda.synchronize()
                x["cross"] = cross
                break
            except Exception as e:  # noqa: BLE001 - said in the results
                x.setdefault("errors", []).append(f"cross {cross}: {str(e)[:400]}")
                log(f"  {prec}: the network with cross layers {cross} failed: {str(e)[:400]}")
                net = fn = None
        if fn is None:
            x["error"] = "the network did not compile"
            continue
        fpp, layers = linear_flops(net)
        x["flops_per_pair"], x["linear_layers"] = fpp, layers
        x["compile_s"] = time.time() - t0
        log(f"  {prec}: the network ({fpp / 1e6:.2f} MFLOP a pair over {layers} linear layers, cross layers "
            f"{x['cross']}) {'compiled' if cuda else 'eager'} at batch {B:,} in {x['compile_s']:.0f} s")

        # the launches: CUDA graphs of each slot's lookup + network, lookup alone, network alone
        t0 = time.time()
        graphs, keep = [], []

        def capture(body):
            """A launch of `body`: a CUDA graph of it (warmed up on the capture stream first), or,
            where capture fails or on the CPU, the call itself. (launch, its output)."""
            if not cuda or x.get("graphs") is False:
                return body, None
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    body()
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                res = body()
            graphs.append(g)
            keep.append(res)
            return g.replay, res

        try:
            with torch.no_grad():
                net_in = {"dense": slots[0]["dense"], "pooled": pooled0}
                net_launch, net_out = capture(lambda: fn(net_in["dense"], net_in["pooled"]))
                lookup_launch = [capture(lambda s=s: lookup(s["keys"]))[0] for s in slots[:4]]
                step_launch = [capture(lambda s=s: fn(s["dense"], lookup(s["keys"])))[0] for s in slots]
            x["graphs"] = cuda
        except Exception as e:  # noqa: BLE001 - the eager launches are timed instead, and that is said
            log(f"  {prec}: CUDA graph capture failed ({str(e)[:300]}); timing the eager launches instead")
            x["graphs"], x["graph_error"] = False, str(e)[:500]
            graphs.clear()
            keep.clear()
            torch.cuda.synchronize()
            net_in = {"dense": slots[0]["dense"], "pooled": pooled0}
            net_launch, net_out = (lambda: fn(net_in["dense"], net_in["pooled"])), None
            lookup_launch = [(lambda s=s: lookup(s["keys"])) for s in slots[:4]]
            step_launch = [(lambda s=s: fn(s["dense"], lookup(s["keys"]))) for s in slots]
        x["capture_s"] = time.time() - t0

        with torch.no_grad():
            one = tm.stream()
            net_rate, _ = tm.batches_per_s([(one, [net_launch])], a.iters, a.repeats)
            lookup_rate, _ = tm.batches_per_s([(one, lookup_launch)], a.iters, a.repeats)
            serial_rate, serial_all = tm.batches_per_s([(one, step_launch)], a.iters, a.repeats)
            x["net_s"], x["lookup_s"] = 1 / net_rate, 1 / lookup_rate
            x["tflops"] = fpp * B * net_rate / 1e12
            x["lookup_gb_per_s"] = B * sum(HOT) * DIM * 2 * lookup_rate / 1e9
            x["serial_pairs_per_s"] = B * serial_rate
            x["serial_windows"] = [B * r for r in serial_all]
            x["ideal_pairs_per_s"] = B / max(x["net_s"], x["lookup_s"])
            x["overlap"] = {}
            if cuda:
                for n in a.stream_list:
                    streams = [tm.stream() for _ in range(n)]
                    lanes = [(s, [step_launch[i] for i in range(len(step_launch)) if i % n == j])
                             for j, s in enumerate(streams)]
                    rate, rates = tm.batches_per_s(lanes, a.iters, a.repeats)
                    x["overlap"][str(n)] = {"pairs_per_s": B * rate, "windows": [B * r for r in rates]}
            best = max(x["overlap"].items(), key=lambda kv: kv[1]["pairs_per_s"]) if x["overlap"] else None
            x["overlap_best_streams"] = int(best[0]) if best else None
            x["overlap_pairs_per_s"] = best[1]["pairs_per_s"] if best else None

            # accuracy: the timed network (its graph) on the served check's pairs
            n = n_exact
            net_in["dense"][:n].copy_(ex_d)
            net_in["pooled"][:n].copy_(ex_pooled)
            if net_out is not None:
                net_launch()
                got = net_out[:n].float()
            else:
                got = fn(net_in["dense"], net_in["pooled"])[:n].float()
            diff = (got - want).abs()
            x["accuracy_fp32"] = float(diff.max())
            x["accuracy_mean_fp32"] = float(diff.mean())
            x["accuracy_pairs"] = n
        log(f"  {prec} reference, batch {B:,}: network {x['net_s'] * 1e3:.3f} ms ({x['tflops']:.0f} TFLOP/s), lookup "
            f"{x['lookup_s'] * 1e3:.3f} ms ({x['lookup_gb_per_s']:.0f} GB/s of rows); one after the other "
            f"{x['serial_pairs_per_s'] / 1e6:.2f} M pairs/s; overlapped "
            + (", ".join(f"{k} streams {v['pairs_per_s'] / 1e6:.2f} M" for k, v in x["overlap"].items()) or "-")
            + f"; ideal overlap {x['ideal_pairs_per_s'] / 1e6:.2f} M; predictions vs fp32 max abs diff "
            f"{x['accuracy_fp32']:.3g} ({'CUDA graphs' if x['graphs'] else 'eager launches'})")
        del graphs, keep, net, fn, step_launch, lookup_launch, net_launch, net_out, pooled0, net_in
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        with open(a.reference_worker, "w") as f:
            json.dump(out, f, indent=1)  # each precision's figures kept should a later one fail
    with open(a.reference_worker, "w") as f:
        json.dump(out, f, indent=1)
    return 0


# ------------------------------------------------------------------ the driver

def gpu_facts():
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True)
        line = p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else ""
    except OSError:
        line = ""
    name, driver, memory = [x.strip() for x in ((line or "unknown GPU,-,-").split(",") + ["-", "-"])[:3]]
    return name, driver, memory


def main():
    a = parse()
    if a.export_worker:
        return export_worker(a)
    if a.reference_worker:
        return reference_worker(a)
    if a.report_only:
        with open(os.path.join(a.report_only, "results.json")) as f:
            out = json.load(f)
        write_report(a.report_only, out)
        log(f"wrote {os.path.join(a.report_only, 'README.md')}")
        return 0
    left = lambda: a.deadline_s - (time.time() - T0)  # noqa: E731
    os.makedirs(a.results, exist_ok=True)
    for name in ("README.md", "results.json", "fair.png", "call.tgz"):
        if os.path.exists(os.path.join(a.results, name)):
            os.remove(os.path.join(a.results, name))
    os.makedirs(a.work, exist_ok=True)
    gpu, driver, memory = gpu_facts() if a.device == "cuda" else ("cpu", "-", "-")
    peaks, peak_of = peaks_for(gpu)
    out = {"command": a.command, "gpu": gpu, "driver": driver, "gpu_memory": memory, "peaks_tflops": peaks,
           "peaks_of": peak_of, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "batch": a.batch,
           "big_pairs": a.big_pairs, "instances": a.instances, "cross": a.cross, "scale": a.scale,
           "precisions": a.precision_list, "served": {}, "reference": None, "package": {}, "skipped": [],
           "failures": [], "phases": {}}
    log(f"GPU: {gpu} ({memory}), driver {driver}; peaks (dense, {peak_of}): fp16 {peaks['fp16']:.0f}, "
        f"FP8 {peaks['fp8']:.0f} TFLOP/s")
    for d in ("/dev/shm", "/tmp"):
        if os.path.isdir(d):
            u = shutil.disk_usage(d)
            log(f"  {d}: {u.free / 1e9:.0f} GB free of {u.total / 1e9:.0f} GB")

    def save():
        with open(os.path.join(a.results, "results.json"), "w") as f:
            json.dump(out, f, indent=1)

    def mark(name, t0):
        out["phases"][name] = round(time.time() - t0, 1)

    served = a.device == "cuda" and not a.skip_served
    works = {p: os.path.join(a.work, p) for p in a.precision_list}
    # 1. the fixture and the packages, at once
    if served or a.device == "cuda":
        phase("the fixture (criteo_fixture) and the packages' exports, at once")
        t0 = time.time()
        fixture = {}
        writer = None
        if served:
            from recsys.fixture import fixture_rows, prepare

            def write_tables():
                try:
                    fa = SimpleNamespace(fixture="", scale=a.scale, dim=DIM, work=a.work, fixture_bin=a.fixture_bin,
                                         cache_share=1.0, host_memory="mapped")
                    fixture["folder"], _ = prepare(fa, fixture_rows(a.scale))
                except BaseException as e:  # noqa: BLE001 - said below
                    fixture["error"] = e

            writer = threading.Thread(target=write_tables, name="fixture")
            writer.start()
        exports = {p: subprocess.Popen([sys.executable, os.path.abspath(__file__), "--cross", a.cross,
                                        "--export-worker", p, works[p], str(a.batch)]) for p in a.precision_list}
        for p, proc in exports.items():
            try:
                rc = proc.wait(timeout=max(30, left() - 200))
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "timeout"
            if rc != 0 or not os.path.exists(package_path(works[p])):
                out["failures"].append(f"the {p} package's export: exit {rc}")
        if writer is not None:
            writer.join()
            if "error" in fixture:
                out["failures"].append(f"the fixture: {fixture['error']}")
                served = False
        mark("fixture_and_exports", t0)
        save()

    def serve(prec):
        if "the fixture" in " ".join(out["failures"]) or not os.path.exists(package_path(works[prec])):
            out["skipped"].append(f"{prec} served: no package or no fixture")
            return
        # the room the later phases need (what they took on an H200): the reference, the other
        # served runs, the packages alone
        later = (0 if out["reference"] else REFERENCE_S(len(a.precision_list))) + PACKAGE_S * len(a.precision_list) \
            + sum(SERVED_S for p in a.precision_list if p not in out["served"] and p != prec)
        budget = min(a.served_budget_s, left() - later)
        if budget < 100:  # dlrm_v2_perf.py reaches the stream ~45 s in and runs it with 70 s of budget left
            out["skipped"].append(f"{prec} served: {left():.0f} s left")
            log(f"  (skipped: {prec} served; {left():.0f} s left)")
            return
        phase(f"{prec} served (dlrm_v2_perf.py, --budget-s {budget:.0f})")
        t0 = time.time()
        cmd = served_command(a, prec, budget)
        log("  " + " ".join(cmd))
        try:
            rc = subprocess.run(cmd, timeout=budget + 120).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        fig = served_figures(os.path.join(a.work, f"served_{prec}"))
        fig["rc"] = rc
        fig["budget_s"] = budget
        out["served"][prec] = fig
        if rc != 0:
            out["failures"].append(f"{prec} served: dlrm_v2_perf.py exit {rc}")
        mark(f"served_{prec}", t0)
        save()

    def reference():
        if left() < REFERENCE_S(len(a.precision_list)) * 0.7:
            out["skipped"].append(f"the reference: {left():.0f} s left")
            log(f"  (skipped: the reference; {left():.0f} s left)")
            return
        phase("the bare PyTorch reference (F.embedding_bag + the compiled network, CUDA graphs, streams)")
        t0 = time.time()
        path = os.path.join(a.work, "reference.json")
        if os.path.exists(path):
            os.remove(path)
        cmd = [sys.executable, os.path.abspath(__file__), "--reference-worker", path, "--device", a.device,
               "--precisions", ",".join(a.precision_list), "--cross", a.cross, "--scale", str(a.scale),
               "--batch", str(a.batch), "--big-pairs", str(a.big_pairs), "--streams", a.streams, "--iters", str(a.iters),
               "--repeats", str(a.repeats), "--alpha", str(a.alpha)]
        try:
            rc = subprocess.run(cmd, timeout=max(60, min(360, left() - 20))).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if os.path.exists(path):
            with open(path) as f:
                out["reference"] = json.load(f)
        if rc != 0:
            out["failures"].append(f"the reference: exit {rc}")
        mark("reference", t0)
        save()

    def packages():
        if not os.path.exists(a.aoti_bare):
            out["skipped"].append(f"the packages alone: no {a.aoti_bare}")
            return
        from dlrm_v2_network import package_seconds
        for p in a.precision_list:
            path = package_path(works[p])
            if not os.path.exists(path) or left() < 25:
                out["skipped"].append(f"the {p} package alone" + ("" if os.path.exists(path) else ": no package"))
                continue
            phase(f"the {p} package's network alone (aoti_bare, CUDA graph replays)")
            t0 = time.time()
            try:
                secs = package_seconds(SimpleNamespace(aoti_bare=a.aoti_bare, iters=max(20, a.iters)), path, [a.batch])
            except Exception as e:  # noqa: BLE001 - said in the results
                secs = {}
                log(f"  aoti_bare: {e}")
            if a.batch in secs:
                out["package"][p] = {"net_s": secs[a.batch]}
                log(f"  {p} package, batch {a.batch:,}: {secs[a.batch] * 1e3:.3f} ms")
            else:
                out["failures"].append(f"the {p} package alone: no figure")
            mark(f"package_{p}", t0)
            save()

    if served:
        serve(a.precision_list[0])
    reference()
    if served:
        for p in a.precision_list[1:]:
            serve(p)
    if a.device == "cuda":
        packages()

    phase("results")
    add_figures(out)
    save()
    for line in summary_lines(out):
        log(line)
    try:
        write_report(a.results, out)
    except Exception as e:  # noqa: BLE001 - results.json is written: --report-only makes it again
        log(f"the report failed ({e}); python3 bench/gpu/dlrm_v2_fair.py --report-only {a.results}")
        out["failures"].append(f"report: {e}")
    # one archive: the host's facts, the GPU's samples, both served runs whole
    with tarfile.open(os.path.join(a.results, "call.tgz"), "w:gz") as tar:
        for path in (os.path.join(a.results, "host.txt"), os.path.join(a.work, "gpu_dmon.log")):
            if os.path.exists(path):
                tar.add(path, arcname=f"call/{os.path.basename(path)}")
        for p in a.precision_list:
            folder = os.path.join(a.work, f"served_{p}")
            if os.path.isdir(folder):
                tar.add(folder, arcname=f"call/served_{p}")
    if os.path.exists(os.path.join(a.results, "host.txt")):
        os.remove(os.path.join(a.results, "host.txt"))  # in call.tgz, and at console.log's head
    for s in out["skipped"]:
        log(f"SKIPPED {s}")
    for f in out["failures"]:
        log(f"FAIL {f}")
    log(f"dlrm_v2_fair: {'every phase ran' if not out['failures'] else str(len(out['failures'])) + ' failures'}; "
        f"{time.time() - T0:.0f} s; results in {a.results}")
    return 1 if out["failures"] else 0


# ------------------------------------------------------------------ figures and the report

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


if __name__ == "__main__":
    sys.exit(main())
