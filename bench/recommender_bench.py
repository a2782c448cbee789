#!/usr/bin/env python3
"""A recommender served as one model (engine "recommender": lookup feeding the dense network
inside the backend) against the same model as Triton's ensemble of two (the `*_sparse`
embedding model, then the `*_dense` ONNX model), on this machine's CPU, measured by NVIDIA's
perf_analyzer (gRPC, system shared memory, concurrency 1) in one server and one run, with
the ratio single/ensemble per batch size.

    source scripts/env.sh
    python bench/recommender_bench.py [--model dlrm] [--batches 256,1024,4096] [--seconds 4]

Uses the example repository (models/, tables written by examples/recommenders.py) and
$PERF_ANALYZER (the tritonclient wheel's binary, scripts/env.sh).
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
from tritonserver_process import serve  # noqa: E402


def perf(pa, port, model, batch, seconds, out):
    cmd = [pa, "-m", model, "-b", str(batch), "--concurrency-range", "1:1", "-i", "grpc", "-u", f"localhost:{port + 1}",
           "--shared-memory", "system", "--output-shared-memory-size", str(batch * 4 + 4096),
           "--measurement-interval", str(int(seconds * 1000)), "-f", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-2000:])
        raise SystemExit(f"perf_analyzer failed: {' '.join(cmd)}")
    with open(out) as f:
        row = next(csv.DictReader(f))
    return float(row["Inferences/Second"]), float(row["p50 latency"]) / 1e3, float(row["p99 latency"]) / 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="dlrm", choices=["dlrm", "dcnv2", "wide_deep"])
    p.add_argument("--batches", default="256,1024,4096")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--port", type=int, default=19300)
    a = p.parse_args()
    from recommenders import single_model

    models = os.path.join(ROOT, "models")
    server = os.environ.get("TRITONSERVER")
    pa = os.environ.get("PERF_ANALYZER")
    backends = os.path.join(ROOT, "install", "backends")
    if not (server and pa and os.path.isfile(os.path.join(backends, "rust", "libtriton_rust.so"))):
        raise SystemExit("run `bash scripts/build.sh` and `source scripts/env.sh` first")
    if not os.path.isfile(os.path.join(models, f"{a.model}_sparse", "1", "tables", "t0", "vectors.npy")):
        raise SystemExit("write the example tables first: python examples/recommenders.py --repo models --rows 1000")
    work = tempfile.mkdtemp(prefix="recommender-bench-")
    repo = os.path.join(work, "repo")
    os.makedirs(repo)
    for m in (a.model, f"{a.model}_sparse", f"{a.model}_dense"):
        os.makedirs(os.path.join(repo, m))
        os.symlink(os.path.join(models, m, "1"), os.path.join(repo, m, "1"))
        with open(os.path.join(models, m, "config.pbtxt")) as src, open(os.path.join(repo, m, "config.pbtxt"), "w") as dst:
            dst.write(src.read())
    single = single_model(models, a.model, repo)
    extra = ["--model-control-mode=none", f"--backend-config=rust,onnxruntime-library={os.environ.get('ORT_LIB', '')}"]
    print(f"{a.model} on this CPU ({os.cpu_count()} cores): one model ({single}) vs Triton's ensemble ({a.model}); "
          f"perf_analyzer gRPC, system shared memory, concurrency 1, {a.seconds:.0f} s windows")
    print(f"{'batch':>6} {'ensemble inf/s':>15} {'p50 ms':>8} {'p99 ms':>8} {'one model inf/s':>16} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>6}")
    with serve(server, repo, backends, a.port, os.path.join(work, "server.log"), extra=extra):
        for b in [int(x) for x in a.batches.split(",")]:
            e = perf(pa, a.port, a.model, b, a.seconds, os.path.join(work, f"e{b}.csv"))
            s = perf(pa, a.port, single, b, a.seconds, os.path.join(work, f"s{b}.csv"))
            print(f"{b:>6} {e[0]:>15,.0f} {e[1]:>8.2f} {e[2]:>8.2f} {s[0]:>16,.0f} {s[1]:>8.2f} {s[2]:>8.2f} {s[0] / e[0]:>6.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
