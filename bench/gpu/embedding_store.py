#!/usr/bin/env python3
"""The embedding store on a GPU instance of the real tritonserver (issue: hierarchical
embedding store, item 7). Needs an NVIDIA GPU; run through bench/gpu/run.sh models.

Builds a table set several times larger than the GPU cache, serves it through
libtriton_rust.so's embedding engine (HPS interface, KIND_GPU), checks returned rows
against the host tier's files (max abs diff), then drives Zipf-distributed lookups from
several client threads and prints lookups/s, the cache hit rate (from the server's own
Prometheus metrics), and the effective GB/s of rows returned against the GPU's memory
bandwidth."""
import argparse
import os
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
from kserve_client import Client  # noqa: E402
from tritonserver_process import serve  # noqa: E402
from make_tables import write_table  # noqa: E402

# Peak memory bandwidth, GB/s (vendor figures), to put the effective rate in context.
HBM_GBPS = {"H100": 3350, "H200": 4800, "A100": 2039}


def zipf_sampler(n, exponent, seed):
    ranks = np.arange(1, n + 1, dtype=np.float64)
    cdf = np.cumsum(1.0 / ranks ** exponent)
    cdf /= cdf[-1]
    perm = np.random.default_rng(seed).permutation(n)  # hot keys spread over the key space
    rng = np.random.default_rng(seed + 1)

    def draw(k):
        return perm[np.minimum(np.searchsorted(cdf, rng.random(k)), n - 1)].astype(np.int64)
    return draw


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--server", required=True, help="tritonserver binary")
    p.add_argument("--backends", required=True, help="directory holding rust/libtriton_rust.so")
    p.add_argument("--work", default="/tmp/embedding_bench")
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--rows", type=int, default=2_000_000, help="rows per table")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--cache-ratio", type=float, default=0.1)
    p.add_argument("--keys-per-request", type=int, default=65536)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--port", type=int, default=18500)
    a = p.parse_args()

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print(f"GPU: {gpu}")
    repo = os.path.join(a.work, "repo")
    version = os.path.join(repo, "store", "1")
    names = [f"t{i}" for i in range(a.tables)]
    t0 = time.time()
    for i, n in enumerate(names):
        if not os.path.exists(os.path.join(version, "tables", n, "vectors.npy")):
            write_table(os.path.join(version, "tables"), n, a.rows, a.dim, seed=100 + i)
    total_gb = a.tables * a.rows * a.dim * 4 / 1e9
    print(f"tables: {a.tables} x {a.rows} rows x dim {a.dim} = {total_gb:.2f} GB on the host "
          f"({time.time() - t0:.0f} s to write); GPU cache {a.cache_ratio:.0%} of the rows = {total_gb * a.cache_ratio:.2f} GB")
    with open(os.path.join(repo, "store", "config.pbtxt"), "w") as f:
        f.write(f"""name: "store"
backend: "rust"
max_batch_size: 0
input [ {{ name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] }}, {{ name: "NUMKEYS" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_GPU gpus: [ 0 ] }} ]
parameters {{ key: "engine" value {{ string_value: "embedding" }} }}
parameters {{ key: "embedding_table_names" value {{ string_value: "{','.join(names)}" }} }}
parameters {{ key: "embedding_vecsize_per_table" value {{ string_value: "{a.dim}" }} }}
parameters {{ key: "gpucacheper" value {{ string_value: "{a.cache_ratio}" }} }}
parameters {{ key: "hit_rate_threshold" value {{ string_value: "0.9" }} }}
""")
    with serve(a.server, repo, a.backends, a.port, os.path.join(a.work, "server.log"),
               extra=["--log-verbose=0"], timeout=300) as c:
        for line in open(os.path.join(a.work, "server.log")):
            if "store 'store'" in line or "ready on Gpu" in line:
                print("[server]", line.strip()[-160:])

        vectors = [np.load(os.path.join(version, "tables", n, "vectors.npy"), mmap_mode="r") for n in names]
        per_table = a.keys_per_request // a.tables
        numkeys = np.full(a.tables, per_table, dtype=np.int32)
        draws = [zipf_sampler(a.rows, a.zipf, seed=7 + t) for t in range(a.tables)]

        # correctness: every returned row equals the host tier's row (cold, then warm cache)
        worst = 0.0
        for it in range(6):
            keys = np.concatenate([d(per_table) for d in draws])
            out = c.infer("store", {"KEYS": keys, "NUMKEYS": numkeys}, ["OUTPUT0"])["OUTPUT0"]
            out = out.reshape(a.tables, per_table, a.dim)
            for t in range(a.tables):
                ref = vectors[t][keys[t * per_table:(t + 1) * per_table]]
                worst = max(worst, float(np.abs(out[t] - ref).max()))
        print(f"correctness: {6 * per_table * a.tables} rows checked against the host tier, max abs diff {worst}")

        # load: Zipf keys from several threads for a fixed time
        counts = [0] * a.threads
        stop = time.time() + a.duration

        def worker(i):
            cl = Client(f"localhost:{a.port}")
            local = [zipf_sampler(a.rows, a.zipf, seed=1000 * i + t) for t in range(a.tables)]
            batches = [np.concatenate([d(per_table) for d in local]) for _ in range(8)]
            j = 0
            while time.time() < stop:
                cl.infer("store", {"KEYS": batches[j % 8], "NUMKEYS": numkeys}, ["OUTPUT0"])
                counts[i] += per_table * a.tables
                j += 1
            cl.close()

        before = metric_sum(a.port)
        t0 = time.time()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        secs = time.time() - t0
        time.sleep(0.6)  # one metrics publishing interval
        after = metric_sum(a.port)
        lookups = sum(counts)
        rate = lookups / secs
        hits = after["cache"] - before["cache"]
        keys_seen = after["keys"] - before["keys"]
        gbps = rate * a.dim * 4 / 1e9
        peak = next((v for k, v in HBM_GBPS.items() if k in gpu), None)
        print(f"load: {a.threads} client threads x {a.keys_per_request} keys per request, Zipf({a.zipf}), {secs:.1f} s")
        print(f"  lookups/s            {rate / 1e6:.2f} M keys/s through tritonserver (HTTP, rows returned to the client)")
        print(f"  cache hit rate       {hits / max(keys_seen, 1):.3f} (server metrics: {hits:.0f} hits of {keys_seen:.0f} keys)")
        print(f"  effective bandwidth  {gbps:.2f} GB/s of rows returned"
              + (f" = {100 * gbps / peak:.2f}% of the GPU's {peak} GB/s" if peak else ""))
        server_stats = c.stats("store")["inference_stats"]
        n = max(server_stats["success"]["count"], 1)
        print("  server time per request (ms): queue {:.2f}, compute_input {:.2f}, compute_infer {:.2f}, compute_output {:.2f}".format(
            *(server_stats[k]["ns"] / n / 1e6 for k in ("queue", "compute_input", "compute_infer", "compute_output"))))


def metric_sum(port):
    import requests
    text = requests.get(f"http://localhost:{port + 2}/metrics").text
    out = {"cache": 0.0, "keys": 0.0}
    for line in text.splitlines():
        if line.startswith("rust_embedding_hits_total") and 'tier="cache"' in line:
            out["cache"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("rust_embedding_lookup_keys_total"):
            out["keys"] += float(line.rsplit(" ", 1)[1])
    return out


if __name__ == "__main__":
    main()
