#!/usr/bin/env python3
"""MLPerf's DLRM-v2 served as one recommender model on a GPU instance of the real tritonserver
(issue 46): its answers against the PyTorch reference on the same GPU, and a first served figure.
Needs an NVIDIA GPU; run through `bash bench/gpu/run.sh dlrm-v2-check` (carry .carry).

examples/dlrm_v2.py writes the model at ``--scale`` of MLPerf's rows (26 tables of dim 128,
hotness 214 keys a sample, sum-pooled; the DCNv2 network as TorchScript, which reads the pooled
rows in GPU memory), served KIND_GPU with the tables' GPU cache at ``--cache``. Checked: the
predictions of batches of 1 to 4096 pairs against the reference (EmbeddingBag per table, then
the network, on the GPU in fp32). Timed: one HTTP client sending requests of ``--batch`` pairs
(every bag full), in pairs/s and lookups/s: a served figure with the HTTP path in it, not the
benchmark the issue asks for (perf_analyzer, MLPerf's query sizes, the endless stream)."""
import argparse
import os
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import dlrm_v2  # noqa: E402
from kserve_client import Client  # noqa: E402
from tritonserver_process import serve  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--work", default="/tmp/dlrm_v2_check")
    p.add_argument("--scale", type=float, default=1e-3)
    p.add_argument("--cache", type=float, default=0.1, help="gpucacheper")
    p.add_argument("--batch", type=int, default=4096, help="pairs a request in the timed part")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--port", type=int, default=18700)
    p.add_argument("--verbose", action="store_true",
                   help="serve with --log-verbose=1 and print the backend's last timing lines (where a batch's time goes)")
    a = p.parse_args()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print(f"GPU: {gpu}")
    repo = os.path.join(a.work, "repo")
    t0 = time.time()
    model = dlrm_v2.export(repo, a.scale, max_batch=8192, instance_kind="KIND_GPU", network="torchscript")
    with open(os.path.join(repo, "dlrm_v2", "config.pbtxt"), "a") as f:
        f.write(f'parameters {{ key: "gpucacheper" value {{ string_value: "{a.cache}" }} }}\n')
    rows = dlrm_v2.scaled_rows(a.scale)
    print(f"dlrm_v2 at scale {a.scale}: {sum(rows):,} rows ({sum(rows) * dlrm_v2.DIM / 1e6:.1f} M parameters in the "
          f"tables, GPU cache {a.cache:.0%}), {sum(dlrm_v2.HOTNESS)} lookups a pair; exported in {time.time() - t0:.0f} s")
    ref = model.cuda().eval()
    failures = []
    extra = ["--log-verbose=1"] if a.verbose else []
    log = os.path.join(a.work, "server.log")
    with serve(a.server, repo, a.backends, a.port, log, extra=extra, timeout=600) as c:
        for line in open(os.path.join(a.work, "server.log")):
            if "ready on Gpu" in line or "loaded from" in line:
                print("[server]", line.strip()[-120:])
        worst = 0.0
        for seed, batch in enumerate((1, 7, 256, 4096, 4096)):
            dense, sparse = dlrm_v2.sample_inputs(batch, rows, seed=seed)
            got = c.infer("dlrm_v2", {"dense": dense, "sparse": sparse}, ["prediction"])["prediction"]
            with torch.no_grad():
                want = ref(torch.from_numpy(dense).cuda(), torch.from_numpy(sparse).cuda()).cpu().numpy()
            diff = float(np.abs(got - want).max())
            worst = max(worst, diff)
            if not np.allclose(got, want, rtol=1e-3, atol=1e-4):
                failures.append(f"batch {batch}: max abs diff {diff:.2e}")
        print(f"  predictions of 1 to 4096 pairs against the PyTorch reference on the GPU: max abs diff {worst:.2e}")
        dense, sparse = dlrm_v2.sample_inputs(a.batch, rows, seed=99, full=1.0)
        c.infer("dlrm_v2", {"dense": dense, "sparse": sparse}, ["prediction"])
        before = c.stats("dlrm_v2")
        n, t0 = 0, time.time()
        while time.time() - t0 < a.seconds:
            c.infer("dlrm_v2", {"dense": dense, "sparse": sparse}, ["prediction"])
            n += 1
        secs = time.time() - t0
        after = c.stats("dlrm_v2")
        pairs = n * a.batch / secs
        print(f"  served, one HTTP client, {a.batch} pairs a request: {n / secs:.1f} requests/s, "
              f"{pairs / 1e6:.2f} M pairs/s, {pairs * sum(dlrm_v2.HOTNESS) / 1e9:.2f} G lookups/s "
              f"(HTTP and the host's key handling included; not the issue's benchmark)")
        # where a request's time went, from Triton's statistics (ms per execution)
        execs = max(int(after["execution_count"]) - int(before["execution_count"]), 1)
        part = {k: (int(after["inference_stats"][k]["ns"]) - int(before["inference_stats"][k]["ns"])) / execs / 1e6
                for k in ("queue", "compute_input", "compute_infer", "compute_output")}
        wall = secs / max(n, 1) * 1e3
        print(f"  per request (ms): {wall:.1f} at the client; in the server queue {part['queue']:.2f}, "
              f"input {part['compute_input']:.2f}, infer {part['compute_infer']:.2f} (keys checked, bags "
              f"built, lookup, pooling, network), output {part['compute_output']:.2f}; the rest "
              f"({wall - sum(part.values()):.1f}) is HTTP and the client")
    if a.verbose:
        timing = [line.strip() for line in open(log) if '"timing:' in line]
        for line in timing[-6:]:
            print("[server]", line[line.index("timing:"):][:260])
    for f in failures:
        print("FAIL", f)
    print("dlrm_v2_check: " + ("every check passed" if not failures else f"{len(failures)} failures"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
