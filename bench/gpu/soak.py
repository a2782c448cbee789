#!/usr/bin/env python3
"""Soak (issue 10): 256 concurrent clients for 8 minutes over the six models (FP32:
ResNet50, BERT-large QA, FastPitch, and the DLRM, DCNv2 and Wide&Deep ensembles whose
sparse step is the GPU embedding store), with bad requests and model reloads mixed in.

Prints per 1-minute window: requests and items per second, p50/p99 latency of the good
requests, errors by kind (expected 4xx for the bad requests; anything else is counted
as unexpected), wrong answers, and the server's RSS and GPU memory. Every good answer is
compared with the first answer to the same input, within 1e-3 of the output's largest
magnitude (at least 1e-3): FP32, where the batch a request lands in changes results by
~1e-6 for most models; FastPitch's convolutions move by up to 3.4e-3 on values of a few
units on an H100, which an absolute 1e-3 would count as wrong answers. A reload
changes a parameter in the model's config and loads it: Triton loads the new copy before
it retires the old one, so clients see no gap (a comment-only change is no change to
Triton and does not reload).

Uses the repository bench/gpu/all_models.py leaves in /tmp/all_models/repo (run
bench/gpu/run.sh models first on the same machine).

    python3 bench/gpu/soak.py --server $PYT/pytriton/tritonserver/bin/tritonserver --backends /tmp/rust_backends
"""
import argparse
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from kserve_client import Client, InferError  # noqa: E402
from tritonserver_process import gpu_mib, rss_mib, serve, server_pid  # noqa: E402

TOL = 1e-3


def workload(seed=0):
    """(model, feeds, outputs, items, weight) for each good request kind."""
    r = np.random.default_rng(seed)
    w = []
    for i in range(3):
        w.append(("resnet50_fp32", {"INPUT__0": r.standard_normal((1, 3, 224, 224)).astype(np.float32)}, ["OUTPUT__0"], 1, 20))
        ids = r.integers(1, 30522, (1, 384)).astype(np.int32)
        seg = np.zeros((1, 384), np.int32)
        w.append(("bert_large_fp32", {"input__0": ids, "input__1": seg, "input__2": np.ones((1, 384), np.int32)},
                  ["output__0", "output__1"], 1, 20))
        w.append(("fastpitch_fp32", {"INPUT__0": r.integers(1, 148, (1, 128)).astype(np.int64)}, ["OUTPUT__1", "OUTPUT__2"], 1, 15))
        for ens in ("dlrm_fp32", "dcnv2_fp32", "wide_deep_fp32"):
            b = 64
            w.append((ens, {"dense": r.standard_normal((b, 13)).astype(np.float32),
                            "sparse": r.integers(0, 100_000, (b, 26)).astype(np.int64)}, ["prediction"], b, 15))
    return w


def bad_requests():
    """(label, model, feeds, outputs): each must be refused with a 4xx."""
    r = np.random.default_rng(9)
    return [
        ("wrong shape", "resnet50_fp32", {"INPUT__0": r.standard_normal((1, 3, 224, 223)).astype(np.float32)}, ["OUTPUT__0"]),
        ("wrong dtype", "resnet50_fp32", {"INPUT__0": np.zeros((1, 3, 224, 224), np.int32)}, ["OUTPUT__0"]),
        ("missing input", "bert_large_fp32", {"input__0": np.ones((1, 384), np.int32)}, ["output__0"]),
        ("unknown model", "no_such_model", {"x": np.zeros((1, 4), np.float32)}, ["y"]),
        ("bad ensemble input", "dlrm_fp32", {"dense": np.zeros((4, 12), np.float32), "sparse": np.zeros((4, 26), np.int64)}, ["prediction"]),
    ]


def memory(pid):
    return rss_mib(pid), gpu_mib(pid)


class Window:
    def __init__(self):
        self.lock = threading.Lock()
        self.lat, self.items, self.requests = [], 0, 0
        self.errors = {}

    def ok(self, ms, items):
        with self.lock:
            self.lat.append(ms)
            self.items += items
            self.requests += 1

    def err(self, kind):
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1
            self.requests += 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--repo", default="/tmp/all_models/repo")
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--port", type=int, default=19000)
    p.add_argument("--bad-share", type=float, default=0.05)
    p.add_argument("--reload-every", type=float, default=40.0, help="seconds between model reloads")
    a = p.parse_args()
    if not os.path.isdir(a.repo):
        raise SystemExit(f"{a.repo} not found: run bench/gpu/run.sh models first")
    import torch
    libtorch = os.path.join(os.path.dirname(torch.__file__), "lib")
    models = ["resnet50_fp32", "bert_large_fp32", "fastpitch_fp32", "dlrm_sparse", "dcnv2_sparse", "wide_deep_sparse",
              "dlrm_dense_fp32", "dcnv2_dense_fp32", "wide_deep_dense_fp32", "dlrm_fp32", "dcnv2_fp32", "wide_deep_fp32"]
    extra = ["--model-control-mode=explicit", f"--backend-config=rust,libtorch-dir={libtorch}",
             "--http-thread-count=32"] + [f"--load-model={m}" for m in models]
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    good, bad = workload(), bad_requests()
    weights = [g[4] for g in good]
    with serve(a.server, a.repo, a.backends, a.port, "/tmp/soak_server.log", extra=extra, timeout=300) as c:
        pid = server_pid(a.port)
        refs = [c.infer(m, f, o) for m, f, o, _, _ in good]
        print(f"GPU: {smi}; {a.clients} clients, {a.minutes:g} min, {a.bad_share:.0%} bad requests, "
              f"a model reload every {a.reload_every:g} s; {len(good)} distinct good requests over 6 models")
        windows = [Window() for _ in range(int(np.ceil(a.minutes * 60 / a.window)))]
        start = time.time()
        stop = start + a.minutes * 60
        wrong = []

        def client(i):
            rnd = random.Random(i)
            cl = Client(f"localhost:{a.port}")
            while True:
                now = time.time()
                if now >= stop:
                    break
                w = windows[min(int((now - start) // a.window), len(windows) - 1)]
                if rnd.random() < a.bad_share:
                    label, m, f, o = bad[rnd.randrange(len(bad))]
                    try:
                        cl.infer(m, f, o)
                        w.err(f"bad request answered: {label}")
                    except InferError as e:
                        w.err("expected 4xx" if 400 <= e.status < 500 else f"bad request got {e.status}")
                    except Exception as e:  # noqa: BLE001
                        w.err(f"bad request: {type(e).__name__}")
                        cl = Client(f"localhost:{a.port}")
                    continue
                k = rnd.choices(range(len(good)), weights)[0]
                m, f, o, items, _ = good[k]
                t0 = time.time()
                try:
                    got = cl.infer(m, f, o)
                except InferError as e:
                    w.err(f"{m}: HTTP {e.status}")
                    continue
                except Exception as e:  # noqa: BLE001
                    w.err(f"{m}: {type(e).__name__}")
                    cl = Client(f"localhost:{a.port}")
                    continue
                ms = (time.time() - t0) * 1e3
                diff = max(float(np.abs(got[n].astype(np.float64) - refs[k][n].astype(np.float64)).max())
                           / max(1.0, float(np.abs(refs[k][n]).max())) for n in o)
                if diff > TOL:
                    w.err(f"WRONG ANSWER {m}")
                    wrong.append((m, diff))
                else:
                    w.ok(ms, items)
            cl.close()

        def reloader():
            names = ["resnet50_fp32", "bert_large_fp32", "dlrm_dense_fp32", "fastpitch_fp32"]
            n = 0
            while time.time() + a.reload_every < stop:
                time.sleep(a.reload_every)
                m = names[n % len(names)]
                n += 1
                path = os.path.join(a.repo, m, "config.pbtxt")
                text = "".join(l for l in open(path) if "soak_reload" not in l and not l.startswith("# soak reload"))
                with open(path, "w") as f:  # a changed parameter: Triton really reloads the model
                    f.write(text + f'parameters {{ key: "soak_reload" value {{ string_value: "{n}" }} }}\n')
                req = urllib.request.Request(f"http://localhost:{a.port}/v2/repository/models/{m}/load", data=b"", method="POST")
                t0 = time.time()
                try:
                    urllib.request.urlopen(req, timeout=120).read()
                    print(f"    [{time.time() - start:5.0f} s] reloaded {m} in {time.time() - t0:.1f} s", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"    [{time.time() - start:5.0f} s] reload of {m} FAILED: {e}", flush=True)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.clients)]
        threads.append(threading.Thread(target=reloader, daemon=True))
        for t in threads:
            t.start()
        mem = []
        print(f"{'window':>6} {'req/s':>8} {'items/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'RSS MiB':>8} {'GPU MiB':>8}  errors")
        for i, w in enumerate(windows):
            end = min(start + (i + 1) * a.window, stop)
            time.sleep(max(0.0, end - time.time()))
            mem.append(memory(pid))
            if i == len(windows) - 1:
                for t in threads:
                    t.join(timeout=60)
            with w.lock:
                lat = np.array(w.lat) if w.lat else np.array([np.nan])
                span = end - (start + i * a.window)
                errs = ", ".join(f"{k}: {v}" for k, v in sorted(w.errors.items())) or "none"
                print(f"{i + 1:>6} {w.requests / span:>8.0f} {w.items / span:>9.0f} {np.percentile(lat, 50):>8.1f} "
                      f"{np.percentile(lat, 99):>8.1f} {mem[-1][0]:>8.0f} {mem[-1][1]:>8.0f}  {errs}", flush=True)
        alive = os.path.exists(f"/proc/{pid}") and c.ready()
    p99 = [np.percentile(w.lat, 99) for w in windows if w.lat]
    unexpected = sum(v for w in windows for k, v in w.errors.items() if k != "expected 4xx")
    for m in sorted({m for m, _ in wrong}):
        print(f"  wrong answers from {m}: {sum(1 for x, _ in wrong if x == m)}, max relative diff {max(d for x, d in wrong if x == m):.3e}")
    print(f"server alive and ready at the end: {alive}; wrong answers: {len(wrong)}; unexpected errors: {unexpected}; "
          f"p99 last/first window: {p99[-1] / p99[0]:.2f} (bound 1.5); RSS {mem[0][0]:.0f} -> {mem[-1][0]:.0f} MiB, "
          f"GPU {mem[0][1]:.0f} -> {mem[-1][1]:.0f} MiB")


if __name__ == "__main__":
    main()
