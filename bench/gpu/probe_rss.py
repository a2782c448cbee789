"""RSS and GPU memory of tritonserver holding one GPU-only model, for two builds of the
backend side by side (the same model repository, the same server, one after the other).

Issue 7: the load-time probe engine (a CPU copy of the model made to read its signature)
used to be kept for the model's life even when no CPU instance took it; a GPU-only
BERT-large kept ~1.3 GB of host memory for nothing. This prints the server's RSS once
the model is ready, for each backend directory given.

    python3 bench/gpu/probe_rss.py --server $PYT/pytriton/tritonserver/bin/tritonserver \
        --repo /tmp/all_models/repo --model bert_large_fp32 \
        --backends before=/tmp/before_backends after=/tmp/rust_backends
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tritonserver_process import gpu_mib, rss_mib, serve, server_pid  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--server", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--backends", nargs="+", required=True, help="label=backend-directory ...")
    p.add_argument("--port", type=int, default=18700)
    p.add_argument("--libtorch-dir", default="")
    a = p.parse_args()
    rows = []
    for spec in a.backends:
        label, path = spec.split("=", 1)
        log = f"/tmp/probe_rss_{label}.log"
        if not a.libtorch_dir:
            import torch
            a.libtorch_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
        extra = ["--model-control-mode=explicit", f"--load-model={a.model}", f"--backend-config=rust,libtorch-dir={a.libtorch_dir}"]
        with serve(a.server, a.repo, path, a.port, log, extra=extra):
            pid = server_pid(a.port)
            time.sleep(3)  # let allocator caches settle
            rows.append((label, rss_mib(pid), gpu_mib(pid)))
        time.sleep(2)
    print(f"model {a.model} on KIND_GPU only; server memory once ready:")
    for label, rss, gpu in rows:
        print(f"  {label:8s} RSS {rss:8.0f} MiB   GPU {gpu:8.0f} MiB")
    if len(rows) == 2:
        print(f"  RSS {rows[1][0]} - {rows[0][0]}: {rows[1][1] - rows[0][1]:+.0f} MiB")


if __name__ == "__main__":
    main()
