"""bench/gpu/dlrm_v2_fair.py's packages and served runs: the settings each precision's package is
exported with (so that dlrm_v2_perf.py finds it and reuses it), the export in a child process, and
dlrm_v2_perf.py's command line for a served run and the figures read back from its results."""
import json
import os
import sys
import time
from types import SimpleNamespace

from .dlrm_v2_fair_model import DIM, log

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/gpu, where dlrm_v2_perf.py is


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
    from .networks import export_aoti
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

