"""bench/gpu/recsys_perf.py end to end on this CPU machine, at a tiny scale: it writes the
Criteo fixture, serves DLRM as Triton's ensemble and as one recommender model without
batching (max_batch_size 0, a whole request per perf_analyzer step) with the store-wide
cache allocation, runs NVIDIA's perf_analyzer on both with Zipf key pools, and checks the
served rows against the rows recomputed from the fixture's seed (cold cache, warm cache and
after the load) and the single model against the ensemble. Two ways: an fp32 network fed fp32
rows that the store keeps in a huge-page copy (`host_memory: huge_pages`), and the GPU
machine's defaults, an fp16 network fed fp16 rows (the sparse model's OUTPUT0 TYPE_FP16, the
single model's `recommender_embeddings_type`) read from the fixture's mapping. The GPU run is
the same script (`bench/gpu/run.sh recommenders`); this keeps it honest between GPU sessions."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def run_recsys_perf(tmp_path, args):
    """recsys_perf.py at a tiny scale on KIND_CPU with `args`; returns stdout and its $OUT/recsys."""
    subprocess.run(["cargo", "build", "--release", "-q", "--example", "stream_client"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "triton_rust_embedding", "--example", "criteo_fixture"],
                   cwd=ROOT, check=True)
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out))
    cmd = [sys.executable, os.path.join(ROOT, "bench", "gpu", "recsys_perf.py"),
           "--server", os.environ["TRITONSERVER"], "--backends", os.path.join(ROOT, "install", "backends"),
           "--perf-analyzer", os.environ["PERF_ANALYZER"],
           "--fixture-bin", os.path.join(ROOT, "target", "release", "examples", "criteo_fixture"),
           "--fixture", str(tmp_path / "fixture"), "--work", str(tmp_path / "work"), "--scale", "0.0002",
           "--kind", "KIND_CPU", *args]
    if os.environ.get("LIBTORCH_DIR"):
        cmd += ["--libtorch-dir", os.environ["LIBTORCH_DIR"]]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    print(p.stdout[-4000:], p.stderr[-2000:])
    assert p.returncode == 0
    return p.stdout, out / "recsys"


@pytest.mark.parametrize("precision,host_memory", [("fp32", "huge_pages"), ("fp16", "mapped")])
def test_recsys_benchmark_runs_and_serves_exact_rows(tmp_path, precision, host_memory):
    stdout, res = run_recsys_perf(tmp_path, [
        "--precision", precision, "--models", "dlrm", "--batches", "256", "--conc-batch", "256",
        "--concurrency", "1", "--alphas", "1.05", "--requests", "2", "--interval-ms", "1500", "--port", "19300",
        # Triton takes graph_spec batch sizes on a model without batching (the rows to graph);
        # on KIND_CPU graphs do not apply and the server says so
        "--graphs", "--graph-rows", "256", "--host-memory", host_memory,
        # taken by the server; a CPU instance runs its batches whole and has no key upload
        "--pipeline-parts", "2", "--key-upload", "131072,8"])
    exact = json.loads((res / "exact.json").read_text())["dlrm"]
    assert exact["rows_checked"] > 0
    assert exact["rows_max_abs_diff"] == 0.0
    assert exact["single_vs_ensemble_max_abs_diff"] == 0.0
    setup = json.loads((res / "setup.json").read_text())
    assert setup["allocation"] == "store" and setup["cached_rows"] <= 0.1 * setup["rows"]
    assert setup["host_memory"] == host_memory, "the rows served exactly came from where the store was told to keep them"
    assert setup["rows_type"] == {"fp32": "TYPE_FP32", "fp16": "TYPE_FP16"}[precision]
    log = (res / "server.log").read_text(errors="replace") if (res / "server.log").exists() else ""
    assert "optimization.cuda.graphs applies to KIND_GPU instances" in log
    assert "cold cache" in stdout and "warm cache" in stdout
    # 2 CPU cores: perf_analyzer may not settle on every path, but the runs it gives
    # carry the figures and the cache's hit rate from the server's metrics
    runs = json.loads((res / "runs.json").read_text()) if (res / "runs.json").exists() else []
    for r in runs:
        assert r["Inferences/Second"] > 0 and 0 < r["hit_rate"] <= 1.001 and r["batch"] == 256


def test_recsys_benchmark_wide_deep_sweeps(tmp_path):
    """Wide&Deep's own plan: its batch sweep at concurrency 1 and requests of one size over the
    concurrency values (its seed's offline and online scenarios), exact rows, and the report's
    concurrency section named after that batch."""
    _, res = run_recsys_perf(tmp_path, [
        "--models", "wide_deep", "--dim", "65", "--wide-deep-batches", "64,128", "--wide-deep-conc-batch", "32",
        "--concurrency", "1,2", "--alphas", "1.2", "--requests", "2", "--interval-ms", "1000", "--port", "19320",
        "--paths", "one"])
    exact = json.loads((res / "exact.json").read_text())["wide_deep"]
    assert exact["rows_max_abs_diff"] == 0.0 and exact["largest_batch"]["batch"] == 128
    runs = json.loads((res / "runs.json").read_text()) if (res / "runs.json").exists() else []
    # 2 CPU cores: perf_analyzer may not settle on every point, but what it gives is on the plan
    assert {(r["batch"], r["concurrency"]) for r in runs} <= {(64, 1), (128, 1), (32, 1), (32, 2)}
    if {(32, 1), (32, 2)} <= {(r["batch"], r["concurrency"]) for r in runs}:
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu", "recsys_report.py"), "--runs", str(res),
                        "--out", str(tmp_path / "report"), "--no-plots"], check=True)
        assert "### Batch 32, concurrency sweep" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.parametrize("client", ["compiled", "python"])
def test_endless_stream_measures_the_streams_hit_rate(tmp_path, client):
    """perf_analyzer's pool of 2 requests fits in the cache (its lookups hit after the first
    pass); the stream client's pool, as large as pool_plan says the stream's hit rate needs,
    measures that rate (within sampling error at this tiny scale), sent by the compiled client
    (examples/stream_client.rs) at two concurrencies in turn, or by Python threads. Fills are
    immediate (hit_rate_threshold 1.0): on 2 busy CPUs the background filler drops fills it cannot
    keep up with, and a cache that keeps its old hot rows hits more than an LRU cache (0.962 for
    Python threads against the LRU's 0.940 on CI's machine)."""
    sender = os.path.join(ROOT, "target", "release", "examples", "stream_client") if client == "compiled" else ""
    port = "19330" if client == "compiled" else "19340"
    stdout, res = run_recsys_perf(tmp_path, [
        "--precision", "fp32", "--models", "dlrm", "--batches", "256", "--conc-batch", "256", "--concurrency", "1",
        "--alphas", "1.05", "--requests", "2", "--interval-ms", "1500", "--port", port, "--paths", "one",
        "--stream-concurrency", "2,1" if client == "compiled" else "2", "--stream-passes", "8",
        "--stream-client", sender, "--hit-rate-threshold", "1.0"])
    runs = json.loads((res / "runs.json").read_text())
    streams = json.loads((res / "streams.json").read_text())
    assert [s["concurrency"] for s in streams] == ([2, 1] if client == "compiled" else [2])
    for s in streams:
        assert s["client"] == ("stream_client (compiled)" if client == "compiled" else "Python threads")
        assert s["pool_requests"] == s["pool_needed_requests"] > runs[0]["pool_requests"]
        assert s["inferences_per_s"] > 0 and s["p50_ms"] <= s["p99_ms"]
        assert runs[0]["hit_rate"] > s["lru_hit_rate"] + 0.03, "perf_analyzer's small pool hits (nearly) every time"
        assert abs(s["hit_rate"] - s["lru_hit_rate"]) < 0.01, (s["hit_rate"], s["lru_hit_rate"])
    assert "endless stream (stream_load.py" in stdout
