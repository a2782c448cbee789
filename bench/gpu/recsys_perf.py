#!/usr/bin/env python3
"""Recommenders at Criteo scale through the real tritonserver (issue 8).

One run gives every figure of the issue for DLRM and DCNv2 (and Wide&Deep, `--models
wide_deep --dim 65`: its batch sweep at --wide-deep-batches, default 131072 alone, and requests
of --wide-deep-conc-batch rows over --concurrency):

1. the Criteo-scale store: the 26 Criteo-1TB tables scaled by --scale (0.8: 163 M rows,
   20.9 B parameters, fp16, 43 GB), written by `criteo_fixture` (carried, built by
   bench/gpu/pack.sh) unless already there, with its progress;
2. the bare ceiling: the same dense network (TorchScript, fp16) in torch with every table in
   HBM (one fp16 tensor of all rows, one gather), eager and CUDA-graphed, keys already on the
   GPU; then the tables are freed before the server starts;
3. the served paths, both on KIND_GPU instances and both non-batching (max_batch_size 0, a
   whole request per perf_analyzer step; see bench/gpu/zipf_keys.py): `<m>_ens`, Triton's
   ensemble of the embedding model (`<m>_sparse`, GPU cache of --cache-share of each table's
   rows) and the TorchScript dense model (`<m>_dense`), as HPS users deploy it; and `<m>_one`,
   the recommender engine (lookup and network in one backend model, rows read by the network
   in place on the GPU);
   With `--dense aoti` the single model's network is a CUDA AOTInductor package of the same
   network (`dense.pt2`, exported in this run by examples/aoti_export.py), measured alone by
   aoti_bare (`--aoti-bare`); the ensemble keeps the TorchScript network;
4. perf_analyzer (gRPC, system shared memory; `--shared-memory cuda` puts the inputs on the GPU) at batch --batches, concurrency 1, and at
   --conc-batch over --concurrency, for every Zipf exponent of --alphas, the keys of a pool of
   --requests distinct requests (bench/gpu/zipf_keys.py, hot keys spread over each table);
   the cache's hit rate and keys/s for each run from the server's own metrics (`/metrics`),
   against the hit rate of an endless stream through this LRU cache. perf_analyzer cycles the
   pool, and a pool smaller than the cache's reach fits in it whole (every lookup hits after the
   first pass): `--requests auto` sizes each pool to twice the largest LRU characteristic time
   (pool_plan), at most --pool-gb, and says how large it is and the rate it expects;
5. the exactness check: rows the embedding model served under this load against the rows the
   fixture defines (recomputed here from the seed), max abs diff must be 0; and the single
   model's predictions against the ensemble's, at most --prediction-bound apart. After the runs
   it sends one more distinct request than the single model has instances, so that on a GPU
   some instance answers one from the lookup written straight into its CUDA graph's input.

Writes $OUT/recsys/: one CSV per run in perf_analyzer's columns with Inferences/Second
multiplied by the batch (perf_analyzer counts requests of one step), `runs.json` (every run's
row, hit rate, keys/s), `ceiling.json`, `exact.json`, `setup.json`; bench/gpu/recsys_report.py
turns it into the tables and plots of docs/perf/.

    python3 bench/gpu/recsys_perf.py --server .../tritonserver --backends /tmp/rust_backends \\
        --perf-analyzer /tmp/pa/perf_analyzer/bin/perf_analyzer --fixture-bin .carry/criteo_fixture
"""
import argparse
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from host_qos import add_host_args, apply_host_args  # noqa: E402
import zipf_keys  # noqa: E402
from kserve_client import Client  # noqa: E402
from tritonserver_process import serve  # noqa: E402

TABLES = 26
SEED = 1  # the fixture's seed (criteo_fixture --seed)


def fixture_rows(scale):
    """Rows per table exactly as criteo_fixture computes them."""
    return [max(1, int(r * scale)) for r in zipf_keys.CRITEO_1TB_ROWS]


# ------------------------------------------------------------------ the fixture's rows

def _mix64(k):
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xFF51AFD7ED558CCD)
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xC4CEB9FE1A85EC53)
    return k ^ (k >> np.uint64(33))


def synthetic_rows(seed, table, keys, dim):
    """The fixture's rows (triton_rust_embedding::fixture::synthetic_row) as float32."""
    with np.errstate(over="ignore"):
        base = _mix64(np.array([seed ^ (table << 40)], np.uint64))[0]
        base = base ^ (keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        r = _mix64(base[:, None] ^ np.arange((dim + 3) // 4, dtype=np.uint64)[None, :])
    bits = np.stack([(r >> np.uint64(16 * j)) & np.uint64(0xFFFF) for j in range(4)], axis=-1).reshape(len(keys), -1)[:, :dim]
    sign = (bits >> np.uint64(15)) << np.uint64(15)
    exponent = np.uint64(8) + ((bits >> np.uint64(10)) & np.uint64(3))
    v = sign | (exponent << np.uint64(10)) | (bits & np.uint64(0x3FF))
    return v.astype(np.uint16).view(np.float16).astype(np.float32)


# ------------------------------------------------------------------ the cache

def available_memory():
    """MemAvailable of /proc/meminfo in bytes (0 where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


WHOLE_ROOM = 2  # triton_rust_embedding::WHOLE_ROOM: slots per row of a table cached whole


def cache_rows(rows, share, allocation):
    """Cache slots per table, as triton_rust_embedding::cache_rows computes them."""
    if allocation == "per_table":
        return [int(np.ceil(r * share)) for r in rows]
    budget = int(np.floor(sum(rows) * share))
    out = [0] * len(rows)
    for k, t in enumerate(sorted(range(len(rows)), key=lambda t: rows[t])):
        out[t] = min(WHOLE_ROOM * rows[t], budget // (len(rows) - k))
        budget -= out[t]
    return out


def stationary_hit_rate(rows, cached, alpha):
    """The hit rate a cache holding each table's `cached` hottest keys would have on an
    endless stream of this Zipf law (each table's share of the top ranks' mass, averaged
    over tables: every sample has one key per table). The benchmark's key pool repeats, so
    its measured rate can be above this; this is what production traffic would give."""
    rates = []
    for n, c in zip(rows, cached):
        cdf, head, tail = zipf_keys._law(n, alpha)
        c = min(c, n)
        if c <= len(cdf):
            top = cdf[c - 1] if c > 0 else 0.0
        else:
            lo, hi = len(cdf) + 0.5, c + 0.5
            top = head + ((np.log(hi / lo)) if abs(alpha - 1) < 1e-12 else (hi ** (1 - alpha) - lo ** (1 - alpha)) / (1 - alpha))
        rates.append(top / (head + tail))
    return float(np.mean(rates))


def _probabilities(n, alpha):
    """Table of n rows under the Zipf law: (the first 2^20 ranks' probabilities, the tail's
    probabilities at geometric midpoints, the widths those stand for)."""
    cdf, head, tail = zipf_keys._law(n, alpha)
    z = head + tail
    p_head = np.arange(1, len(cdf) + 1, dtype=np.float64) ** -alpha / z
    if n <= len(cdf):
        return p_head, np.zeros(0), np.zeros(0)
    x = np.geomspace(len(cdf) + 0.5, n + 0.5, 4001)
    mid = np.sqrt(x[1:] * x[:-1])
    return p_head, mid ** -alpha / z, np.diff(x)


def _distinct(probs, t):
    """Expected distinct keys among t independent lookups of the table."""
    ph, pt, w = probs
    return float(np.sum(-np.expm1(-ph * t)) + np.sum(-np.expm1(-pt * t) * w))


def lru_table(n, cached, alpha):
    """(characteristic time T in lookups, hit rate) of an LRU cache of `cached` slots on an
    endless stream of this table's Zipf law (Che's approximation: a key stays cached while fewer
    than `cached` distinct keys follow it; T solves distinct(T) = cached). T is infinite and the
    rate 1 where the cache holds the whole table."""
    if cached >= n:
        return float("inf"), 1.0
    probs = _probabilities(n, alpha)
    lo, hi = 1.0, 1e16
    for _ in range(120):
        mid = np.sqrt(lo * hi)
        lo, hi = (mid, hi) if _distinct(probs, mid) < cached else (lo, mid)
    ph, pt, w = probs
    return lo, float(np.sum(ph * -np.expm1(-ph * lo)) + np.sum(pt * -np.expm1(-pt * lo) * w))


def pool_plan(rows, cached, alpha, batch, bound=0.002):
    """What a pool of distinct requests must hold for the measured hit rate to be the stream's.

    perf_analyzer cycles the pool: P = requests x batch lookups per table, then the same again.
    Under Che's approximation a cyclic pool whose period P exceeds a table's characteristic time
    T gives that table the stream's LRU rate (a key's reuse gaps inside the pool are the stream's;
    a key sampled once comes back only after P > T lookups, evicted by then), while a pool with
    P < T fits in the cache whole and every lookup after the first pass hits. So the pool must
    reach P >= 2 T (a margin over the approximation) on each table whose misses count (stream
    miss rate over 26 tables above a tenth of `bound`). Returns {tables: [(rows, cached, T,
    lru rate)], lru: the stream's LRU rate, needed_lookups: the P needed}."""
    tables = [(n, c, *lru_table(n, c, alpha)) for n, c in zip(rows, cached)]
    counted = [t for t in tables if (1 - t[3]) / len(rows) > bound / 10 and t[2] != float("inf")]
    needed = 2 * max((t[2] for t in counted), default=0.0)
    return {"tables": tables, "lru": float(np.mean([t[3] for t in tables])), "needed_lookups": needed}


def predicted_pool_rate(plan, lookups):
    """The steady hit rate a pool of `lookups` per table is expected to measure (see pool_plan)."""
    return float(np.mean([rate if lookups >= 2 * t else 1.0 for _, _, t, rate in plan["tables"]]))


# ------------------------------------------------------------------ models

def tensor(name, dtype, dims):
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(str(d) for d in dims)} ] }}'


def write_models(repo, name, dense_pt, fixture, dim, share, kind, allocation, graphs=False, host_memory="mapped", graph_rows=(),
                 one_instances=1, rows_type="TYPE_FP32", pipeline_parts=1, key_upload=None, torch_params=(), one_pt2=None,
                 hit_rate_threshold="", cache_sharing="device", cache_rows_type="fp32"):
    """<name>_sparse, <name>_dense, <name>_ens and <name>_one, all without batching; `one_pt2`:
    the single model's network as an AOTInductor package (dense.pt2) instead of the TorchScript
    file the ensemble's network serves. Every
    model on one fixture shares one store (`store_name`: the fixture's folder), so its rows
    are in memory once whichever recommenders are served. `rows_type`: the embeddings
    between lookup and network (the sparse model's OUTPUT0 and the network's input)."""
    files = ",".join(os.path.join(fixture, f"t{i}") for i in range(TABLES))
    store = [
        f'parameters {{ key: "embedding_table_names" value {{ string_value: "{",".join(f"t{i}" for i in range(TABLES))}" }} }}',
        f'parameters {{ key: "embedding_vecsize_per_table" value {{ string_value: "{dim}" }} }}',
        f'parameters {{ key: "sparse_files" value {{ string_value: "{files}" }} }}',
        f'parameters {{ key: "gpucacheper" value {{ string_value: "{share}" }} }}',
        f'parameters {{ key: "gpucache_allocation" value {{ string_value: "{allocation}" }} }}',
        f'parameters {{ key: "store_name" value {{ string_value: "{os.path.basename(os.path.normpath(fixture))}" }} }}',
        f'parameters {{ key: "host_memory" value {{ string_value: "{host_memory}" }} }}',
    ]
    store.append(f'parameters {{ key: "gpucache_sharing" value {{ string_value: "{cache_sharing}" }} }}')
    store.append(f'parameters {{ key: "gpucache_row_type" value {{ string_value: "{cache_rows_type}" }} }}')
    if hit_rate_threshold:
        store.append(f'parameters {{ key: "hit_rate_threshold" value {{ string_value: "{hit_rate_threshold}" }} }}')
    if key_upload:
        piece, tasks = key_upload
        store += [f'parameters {{ key: "gpu_key_piece" value {{ string_value: "{piece}" }} }}',
                  f'parameters {{ key: "gpu_key_upload_tasks" value {{ string_value: "{tasks}" }} }}']
    group = f"instance_group [ {{ count: 1 kind: {kind} }} ]"
    # the single model's instances: they share one cache per GPU (gpucache_sharing device),
    # or each holds its own of the same share (instance)
    one_group = f"instance_group [ {{ count: {one_instances} kind: {kind} }} ]"
    # the network's CUDA graphs: one per request shape (no batching), captured at its first
    # request; with graph_rows only for requests of those rows (graph_spec's batch sizes)
    spec = f" graph_spec [ {', '.join(f'{{ batch_size: {r} }}' for r in graph_rows)} ]" if graph_rows else ""
    opt = [f"optimization {{ cuda {{ graphs: true{spec} }} }}"] if graphs else []
    # torch engine parameters of the network (e.g. TORCH_FUSION_STRATEGY), in both paths
    opt += [f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in torch_params]
    dense_in = tensor("dense", "TYPE_FP32", [-1, 13])
    sparse_in = tensor("sparse", "TYPE_INT64", [-1, TABLES])
    pred = tensor("prediction", "TYPE_FP32", [-1, 1])

    def put(model, lines, files=()):
        d = os.path.join(repo, model, "1")
        os.makedirs(d, exist_ok=True)
        for dst, src in files:
            shutil.copyfile(src, os.path.join(d, dst))
        with open(os.path.join(repo, model, "config.pbtxt"), "w") as f:
            f.write("\n".join([f'name: "{model}"', *lines, ""]))

    put(f"{name}_sparse", ['backend: "rust"', "max_batch_size: 0",
                           f'input [ {tensor("KEYS", "TYPE_INT64", [-1, TABLES])} ]',
                           f'output [ {tensor("OUTPUT0", rows_type, [-1, TABLES, dim])} ]', group,
                           'parameters { key: "engine" value { string_value: "embedding" } }',
                           'parameters { key: "embedding_interface" value { string_value: "batched" } }', *store])
    put(f"{name}_dense", ['backend: "rust"', "max_batch_size: 0",
                          f'input [ {dense_in}, {tensor("embeddings", rows_type, [-1, TABLES, dim])} ]',
                          f"output [ {pred} ]", group, *opt,
                          'parameters { key: "engine" value { string_value: "torch" } }'], [("model.pt", dense_pt)])
    put(f"{name}_ens", ['platform: "ensemble"', "max_batch_size: 0", f"input [ {dense_in}, {sparse_in} ]", f"output [ {pred} ]",
                        "ensemble_scheduling { step [",
                        f'  {{ model_name: "{name}_sparse" model_version: -1 input_map {{ key: "KEYS" value: "sparse" }} '
                        'output_map { key: "OUTPUT0" value: "embeddings" } },',
                        f'  {{ model_name: "{name}_dense" model_version: -1 input_map {{ key: "dense" value: "dense" }} '
                        'input_map { key: "embeddings" value: "embeddings" } output_map { key: "prediction" value: "prediction" } }',
                        "] }"])
    # the torch engine's parameters do not apply to a package
    one_opt = [o for o in opt if not o.startswith("parameters")] if one_pt2 else opt
    put(f"{name}_one", ['backend: "rust"', "max_batch_size: 0", f"input [ {dense_in}, {sparse_in} ]", f"output [ {pred} ]", one_group,
                        *one_opt, 'parameters { key: "engine" value { string_value: "recommender" } }',
                        f'parameters {{ key: "recommender_embeddings_type" value {{ string_value: "{rows_type}" }} }}',
                        f'parameters {{ key: "recommender_pipeline_parts" value {{ string_value: "{pipeline_parts}" }} }}', *store],
        [("dense.pt2", one_pt2)] if one_pt2 else [("dense.pt", dense_pt)])


def dense_network(name, precision, device, interaction="cat", cross="torch"):
    """The recommender's dense network as an nn.Module (fp16: behind fp32 inputs and output);
    `interaction`: DLRM's form, `cross`: DCNv2's (examples/recommenders.py)."""
    import recommenders
    from all_models import HalfDense  # the fp16 network behind fp32 inputs, as the six-model run serves it

    # the dense part does not depend on the tables' sizes: one-row tables keep it small
    options = {"dlrm": {"interaction": interaction}, "dcnv2": {"cross": cross}}.get(name, {})
    part = recommenders.DensePart(recommenders.make(name, [1] * TABLES, **options))
    m = HalfDense(part) if precision == "fp16" else part
    return m.to(device).eval()


def dense_module(name, precision, device, interaction="cat"):
    import torch
    # a script cannot hold the Triton kernels: TorchScript runs the same numbers in the torch forms
    return torch.jit.script(dense_network(name, precision, device, "split" if interaction == "triton" else interaction))


# ------------------------------------------------------------------ the bare ceiling

def ceiling(name, module, rows, dim, batches, requests_of, iters=20):
    """Served-model's network in torch with all tables in HBM: {batch: {eager_ips, graph_ips}}."""
    import torch
    dev = torch.device("cuda")
    big = torch.empty((sum(rows), dim), dtype=torch.half, device=dev)
    big.normal_(0.0, 0.05)
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(rows)[:-1]]), dtype=torch.int64, device=dev)
    out = {}
    with torch.no_grad():
        for b in batches:
            reqs = [(torch.from_numpy(s).to(dev), torch.from_numpy(d).to(dev)) for s, d in requests_of(b)]

            def step(s, d):
                emb = big.index_select(0, (s + offsets).view(-1)).view(s.shape[0], TABLES, dim)
                return module(d, emb)

            for s, d in reqs[:3]:
                step(s, d)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(iters):
                step(*reqs[i % len(reqs)])
            torch.cuda.synchronize()
            eager = b * iters / (time.perf_counter() - t0)
            graph = None
            try:
                ss, sd = reqs[0][0].clone(), reqs[0][1].clone()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        step(ss, sd)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step(ss, sd)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for i in range(iters):
                    s, d = reqs[i % len(reqs)]
                    ss.copy_(s)
                    sd.copy_(d)
                    g.replay()
                torch.cuda.synchronize()
                graph = b * iters / (time.perf_counter() - t0)
                del g
            except Exception as e:  # noqa: BLE001 - capture refused: eager only
                print(f"  (no CUDA graph at batch {b}: {str(e).splitlines()[0][:100]})")
            out[b] = {"eager_ips": eager, "graph_ips": graph}
            print(f"  ceiling {name} batch {b}: eager {eager / 1e6:.2f} M/s, graph "
                  f"{'-' if graph is None else f'{graph / 1e6:.2f} M/s'}", flush=True)
            del reqs
    del big
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------ measuring the server

def scrape(port, model):
    """(keys looked up, cache hits) summed over tables, from the server's metrics."""
    text = urllib.request.urlopen(f"http://localhost:{port + 2}/metrics", timeout=30).read().decode()
    keys = hits = 0.0
    for line in text.splitlines():
        if f'model="{model}"' not in line:
            continue
        if line.startswith("rust_embedding_lookup_keys_total"):
            keys += float(line.rsplit(" ", 1)[1])
        elif line.startswith("rust_embedding_hits_total") and 'tier="cache"' in line:
            hits += float(line.rsplit(" ", 1)[1])
    return keys, hits


def model_stats(client, models):
    """{model: (count, compute_input_ns, compute_infer_ns, compute_output_ns, queue_ns)} from Triton."""
    out = {}
    for m in models:
        st = client.stats(m)["inference_stats"]
        out[m] = [st["success"]["count"]] + [st[k]["ns"] for k in ("compute_input", "compute_infer", "compute_output", "queue")]
    return out


def per_model(before, after):
    """Average per-execution times (ms) of each model between two model_stats calls."""
    res = {}
    for m in after:
        n = after[m][0] - before[m][0]
        if n > 0:
            res[m] = {k: (after[m][i] - before[m][i]) / n / 1e6 for i, k in enumerate(("input", "infer", "output", "queue"), 1)}
    return res


def perf(pa, port, model, batch, conc, data, out_dir, tag, metrics_model, interval_ms, shm="system", protocol="grpc"):
    raw = os.path.join(out_dir, "raw", f"{tag}_b{batch}_c{conc}.csv")
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    grpc = protocol.startswith("grpc")
    url = f"localhost:{port + 1}" if grpc else f"localhost:{port}"
    cmd = [pa, "-m", model, "-b", "1", "--concurrency-range", f"{conc}:{conc}", "-i", "grpc" if grpc else "http",
           "-u", url] + (["--streaming"] if protocol == "grpc-streaming" else []) + [
           "--shared-memory", shm, "--output-shared-memory-size", str(max(1 << 20, batch * 4 * 2)),
           "--input-data", data, "--measurement-interval", str(interval_ms), "--max-trials", "6", "-f", raw]
    k0, h0 = scrape(port, metrics_model)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    stability = 10  # perf_analyzer's default bound (%) on how far its last windows may differ
    # a window's throughput or latency moved by more than the bound: longer windows and a looser
    # bound, twice at most (the console line says which runs were retried; the row keeps the
    # bound it was measured under, and the report lists the rows not measured at 10%)
    for factor, looser in ((2, 25), (4, 50)):
        if p.returncode == 0 or "stable" not in p.stdout + p.stderr:
            break
        print(f"  ({model} b={batch} c={conc}: unstable at -s {stability}; retrying with {factor * interval_ms} ms "
              f"windows and -s {looser})", flush=True)
        retry = cmd[:-2]
        retry[retry.index("--measurement-interval") + 1] = str(factor * interval_ms)
        p = subprocess.run(retry + ["-s", str(looser), "-f", raw], capture_output=True, text=True, timeout=900)
        stability = looser
    secs = time.time() - t0
    k1, h1 = scrape(port, metrics_model)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-2000:])
        print(f"perf_analyzer gave no figure: {' '.join(cmd)}", flush=True)
        return None
    with open(raw) as f:
        rows = list(csv.DictReader(f))
    row = rows[0]
    # one perf_analyzer step is one whole request of `batch` rows
    row["Inferences/Second"] = str(float(row["Inferences/Second"]) * batch)
    row["Batch"] = str(batch)
    path = os.path.join(out_dir, f"{tag}_b{batch}_c{conc}.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    r = {k: float(v) for k, v in row.items() if v not in ("", None) and re.match(r"^-?[0-9.e+]+$", v)}
    r["stability_pct"] = stability
    r["hit_rate"] = (h1 - h0) / (k1 - k0) if k1 > k0 else None
    # keys over the whole perf_analyzer call (its trials and warm-up), a lower bound
    r["keys_per_s"] = (k1 - k0) / secs
    return r


def exactness_cuda_shm(client, name, dim, reqs, batch=1024):
    """Served rows of <name>_sparse for keys sent in CUDA shared memory (the lookup reads them
    on the GPU), against the fixture's rows. The keys are copied into a cudaMalloc'd buffer and
    shared with the server through its cudaIpcMemHandle_t, as Triton's own clients do."""
    from cuda_shm import Region
    worst, checked = 0.0, 0
    for k, (s, _) in enumerate(reqs):
        s = np.ascontiguousarray(s[:batch])
        with Region(client, f"exact_{name}_{k}", s.nbytes) as region:
            region.write(s)
            got = client.infer(f"{name}_sparse", {}, ["OUTPUT0"],
                               shm={"KEYS": (region.name, 0, s.nbytes, s.shape, np.int64)})["OUTPUT0"]
        for t in range(TABLES):
            worst = max(worst, float(np.abs(got[:, t, :].astype(np.float32) - synthetic_rows(SEED, t, s[:, t], dim)).max()))
        checked += s.size
    return {"rows_checked": checked, "rows_max_abs_diff": worst}


def exactness(client, name, rows, dim, reqs, batch=1024):
    """Served rows of <name>_sparse against the fixture's rows; the single model vs the ensemble."""
    worst_rows = 0.0
    checked = 0
    worst_pred = 0.0
    for s, d in reqs:
        s, d = s[:batch], d[:batch]
        got = client.infer(f"{name}_sparse", {"KEYS": s}, ["OUTPUT0"])["OUTPUT0"]
        for t in range(TABLES):
            want = synthetic_rows(SEED, t, s[:, t], dim)
            worst_rows = max(worst_rows, float(np.abs(got[:, t, :] - want).max()))
        checked += s.size
        ens = client.infer(f"{name}_ens", {"dense": d, "sparse": s}, ["prediction"])["prediction"]
        one = client.infer(f"{name}_one", {"dense": d, "sparse": s}, ["prediction"])["prediction"]
        worst_pred = max(worst_pred, float(np.abs(ens - one).max()))
    return {"rows_checked": checked, "rows_max_abs_diff": worst_rows, "single_vs_ensemble_max_abs_diff": worst_pred}


def exactness_problems(e, bound):
    """What an exactness result shows wrong: rows not the fixture's, or the single model's
    predictions farther than `bound` from the ensemble's."""
    problems = []
    if e.get("rows_max_abs_diff", 0.0) != 0.0:
        problems.append(f"served rows differ from the fixture's by {e['rows_max_abs_diff']}")
    diff = e.get("single_vs_ensemble_max_abs_diff")
    if diff is not None and not diff <= bound:
        problems.append(f"the single model's predictions differ from the ensemble's by {diff} (bound {bound})")
    return problems


def sweep_plan(batches, conc_batch, concs):
    """(batch, concurrency) pairs: every batch at concurrency 1, then requests of conc_batch rows
    at each concurrency (0: none), its concurrency-1 point not measured twice."""
    plan = [(b, 1) for b in batches]
    if conc_batch:
        plan += [(conc_batch, c) for c in concs if c != 1 or conc_batch not in batches]
    return plan


def gap_text(gap, bound):
    """A measured hit rate's distance from the stream's, and whether it is within `bound`."""
    return f"{gap:+.4f} ({'within' if abs(gap) <= bound else 'NOT within'} {bound})"


def stream_check(a, m, batch, alpha, rows, plan, streams, out_dir):
    """The one model under an endless stream (stream_load.py, our client): a pool of distinct
    requests holding the lookups per table the stream's hit rate needs (pool_plan), drawn into
    GPU memory, at --stream-concurrency; printed beside perf_analyzer's rows, kept in streams.json."""
    import stream_load
    from kserve_client import Client
    need = max(1, math.ceil(plan["needed_lookups"] / batch))
    cap = max(1, int(a.stream_gb * 1e9 // (batch * TABLES * 8)))
    requests = min(need, cap)
    lru = plan["lru"]
    client_bin = a.stream_client if a.stream_client and os.path.exists(a.stream_client) else None
    results = stream_load.run(lambda: Client(f"localhost:{a.port}"), lambda: scrape(a.port, f"{m}_sparse"), f"{m}_one",
                              rows, batch, requests, alpha, SEED + 17, a.stream_levels, a.stream_passes,
                              gpu=a.kind == "KIND_GPU", client_bin=client_bin, url=f"localhost:{a.port}")
    for r in results:
        r.update({"model": m, "batch": batch, "alpha": alpha, "lru_hit_rate": lru, "pool_needed_requests": need})
        streams.append(r)
        with open(os.path.join(out_dir, "streams.json"), "w") as f:
            json.dump(streams, f, indent=1)
        gap = None if r["hit_rate"] is None else r["hit_rate"] - lru
        verdict = "-" if gap is None else gap_text(gap, a.hit_rate_bound)
        print(f"  {m + '_one':<10} a={alpha:<4} b={batch:<6} c={r['concurrency']:<2} {r['inferences_per_s'] / 1e6:7.2f} M inf/s  "
              f"p99 {r['p99_ms']:8.2f} ms  hit rate {r['hit_rate'] if r['hit_rate'] is None else round(r['hit_rate'], 4)}  "
              f"endless stream (stream_load.py, HTTP, {r['client']}; not perf_analyzer)", flush=True)
        print(f"      p50 {r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f}, p95 {r['p95_ms']:.2f}; a pool of {requests} distinct requests "
              f"({r['pool_lookups_per_table']:,} lookups per table, {r['pool_gb']:.1f} GB of keys in {'GPU' if a.kind == 'KIND_GPU' else 'shared'} memory; the stream's rate "
              f"needs {need}), one pass to warm, {a.stream_passes} measured; the endless stream's LRU rate {lru:.4f}: "
              f"measured - stream {verdict}", flush=True)


def model_settings(pairs, name):
    """The `--inductor` settings for model `name`: KEY=VALUE for every model, MODEL:KEY=VALUE for
    that model alone."""
    out = []
    for pair in pairs:
        model, sep, rest = pair.partition(":")
        if sep and "=" not in model:
            if model == name:
                out.append(rest)
        else:
            out.append(pair)
    return out


def examples_digest():
    """A digest of the model code a package is exported from (examples/*.py)."""
    import hashlib
    h = hashlib.sha256()
    folder = os.path.join(ROOT, "examples")
    for f in sorted(os.listdir(folder)):
        if f.endswith(".py"):
            with open(os.path.join(folder, f), "rb") as src:
                h.update(f.encode() + src.read())
    return h.hexdigest()[:16]


def export_aoti(name, a, rows_type, max_batch):
    """The recommender's dense network as a CUDA AOTInductor package (examples/aoti_export.py),
    exported here with the same weights as the TorchScript file; returns its path."""
    import torch
    import aoti_export
    net = dense_network(name, a.precision, "cuda", a.aoti_dlrm_interaction, a.dcnv2_cross)
    emb = torch.float16 if rows_type == "TYPE_FP16" else torch.float32
    eb = aoti_export.example_batch(a.example_batch, max_batch)
    example = (torch.rand(eb, 13, device="cuda"), (torch.randn(eb, TABLES, a.dim, device="cuda") * 0.05).to(emb))
    path = os.path.join(a.work, f"{name}_dense.pt2")
    t0 = time.time()
    settings = model_settings(a.inductor, name)
    if a.cross_config:
        os.environ["TRITON_RUST_CROSS"] = a.cross_config  # read when the cross-layer kernel is traced
    cross = a.dcnv2_cross
    if cross == "triton":
        import triton_kernels
        cross += " " + triton_kernels.cross_config_text()
    form = {"dlrm": f", interaction {a.aoti_dlrm_interaction}", "dcnv2": f", cross {cross}"}.get(name, "")
    # everything the package depends on: a later run on this machine with the same settings
    # (another protocol, say) serves the package already here instead of exporting it again
    key = json.dumps({"model": name, "precision": a.precision, "rows": rows_type, "form": form, "example_batch": eb,
                      "max_batch": max_batch, "inductor": settings, "torch": torch.__version__,
                      "examples": examples_digest()}, sort_keys=True)
    reused = False
    if os.path.exists(path) and os.path.exists(path + ".key"):
        with open(path + ".key") as f:
            reused = f.read() == key
    if not reused:
        with torch.no_grad():
            aoti_export.package(net, example, path, dynamic_batch=True, max_batch=max_batch, device="cuda",
                                inductor_configs=aoti_export.parse_inductor_configs(settings))
        with open(path + ".key", "w") as f:
            f.write(key)
    print(f"exported {name}'s network as a CUDA package ({os.path.getsize(path) / 1e6:.0f} MB, batch up to {max_batch}, "
          f"example batch {eb}{form}) "
          + ("earlier on this machine, with the same settings (reused)" if reused else f"in {time.time() - t0:.0f} s")
          + (f"; Inductor settings {settings}" if settings else ""), flush=True)
    del net
    torch.cuda.empty_cache()
    return path


def aoti_bare_figures(binary, pt2, batches):
    """{batch: aoti_bare's figures} for the package's network alone (inputs already on the GPU)."""
    cmd = [binary, "--package", pt2, "--batches", ",".join(map(str, batches)), "--iters", "50"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.stderr.strip():
        print("  " + p.stderr.strip()[-1000:], flush=True)
    if p.returncode != 0:
        print(f"  aoti_bare failed ({p.returncode}): {' '.join(cmd)}", flush=True)
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[r["batch"]] = r
            g = f", CUDA graph {r['graph_p50_ms']:.3f} ms ({r['graph_ips'] / 1e6:.2f} M/s)" if r["graph_p50_ms"] else ""
            print(f"  bare AOTI network batch {r['batch']}: plain {r['plain_p50_ms']:.3f} ms "
                  f"({r['plain_ips'] / 1e6:.2f} M/s){g}", flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--perf-analyzer", required=True)
    p.add_argument("--fixture-bin", default=os.path.join(ROOT, ".carry", "criteo_fixture"))
    p.add_argument("--fixture", default="", help="where the tables are (default: /dev/shm/criteo if it has room, else --work)")
    p.add_argument("--work", default="/tmp/recsys")
    p.add_argument("--scale", type=float, default=0.8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--cache-share", type=float, default=0.1)
    p.add_argument("--allocation", default="store", choices=["store", "per_table"],
                   help="gpucache_allocation: the share of the store's rows (small tables whole) or of each table's")
    p.add_argument("--models", default="dlrm,dcnv2")
    p.add_argument("--batches", default="256,1024,4096,16384,65536")
    p.add_argument("--conc-batch", type=int, default=4096)
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--alphas", default="1.2,1.05")
    p.add_argument("--other-alpha-batches", default="4096,65536", help="batches measured at the alphas after the first")
    p.add_argument("--requests", default="auto",
                   help="distinct requests per (batch, alpha) pool, which perf_analyzer cycles: a number (then fewer at "
                        "batches above 4096: half to 16384, a quarter above), or auto: as many as the measured cache hit "
                        "rate needs to be the endless stream's within --hit-rate-bound (see pool_plan), at most --pool-gb")
    p.add_argument("--pool-gb", type=float, default=0.5,
                   help="auto pools: at most this many GB of keys and dense features per pool (perf_analyzer holds the "
                        "pool as JSON and, with --shared-memory cuda, in GPU memory)")
    p.add_argument("--protocol", default="grpc",
                   help="perf_analyzer's protocols to the server, each run once per protocol (its -i: grpc, http, or "
                        "grpc-streaming: gRPC with --streaming, the requests of each client on one bidirectional "
                        "stream), e.g. grpc,http")
    p.add_argument("--stream-concurrency", default="0",
                   help="also serve each measured batch of the one model an endless stream (stream_load.py: a pool as large "
                        "as the stream's hit rate needs, in GPU memory, our HTTP client) at each of these numbers of "
                        "requests in flight (e.g. 4,8: one pool, warmed once); 0: not")
    p.add_argument("--stream-client", default=os.path.join(ROOT, ".carry", "stream_client"),
                   help="the endless stream's sender (examples/stream_client.rs, built by bench/gpu/pack.sh); where it "
                        "is absent, Python threads send")
    p.add_argument("--stream-gb", type=float, default=30.0, help="the endless stream's key pool: at most this many GB")
    p.add_argument("--stream-passes", type=int, default=1, help="the endless stream: passes of its pool measured")
    p.add_argument("--hit-rate-threshold", default="",
                   help="the store's hit_rate_threshold (default: its own, 0.9): a lookup whose hit rate is below it "
                        "inserts its misses before it returns, above it a background thread does and drops what it "
                        "cannot keep up with; 1.0 makes every fill immediate, the LRU cache that Che's approximation "
                        "models whatever the host's load")
    p.add_argument("--prediction-bound", type=float, default=2e-3,
                   help="the single model's predictions may differ from the ensemble's by at most this "
                        "(an FP16 network against the TorchScript one: up to 3.3e-4 measured on an H100; "
                        "a request answered from another request's rows differs by 0.1 or more)")
    p.add_argument("--hit-rate-bound", type=float, default=0.002,
                   help="how far the measured hit rate may be from the endless stream's (LRU) rate")
    p.add_argument("--dense", default="torchscript", choices=["torchscript", "aoti"],
                   help="the single model's network: the TorchScript file (dense.pt), or a CUDA AOTInductor package of "
                        "the same network exported here (dense.pt2, examples/aoti_export.py); the ensemble's network "
                        "stays TorchScript, so the exactness check compares the two")
    p.add_argument("--aoti-bare", default="", help="with --dense aoti: the aoti_bare binary, for the package's bare figures")
    p.add_argument("--inductor", action="append", default=[], metavar="[MODEL:]KEY=VALUE",
                   help="with --dense aoti: an Inductor setting for the export (e.g. max_autotune=true, or "
                        "dcnv2:max_autotune=true for that model alone); repeatable")
    p.add_argument("--example-batch", type=int, default=0,
                   help="with --dense aoti: the batch the package is exported with, Inductor's size hint for the batch "
                        "dimension (default: the largest batch measured; earlier runs used 4)")
    p.add_argument("--paths", default="ens,one")
    p.add_argument("--wide-deep-batches", default="131072",
                   help="wide_deep's batch sweep at concurrency 1 (its seed: 1 and 16384 to 131072 in steps of 16384)")
    p.add_argument("--wide-deep-conc-batch", type=int, default=0,
                   help="wide_deep's requests of this many rows at each --concurrency (its seed's online scenario "
                        "sends 2048-row requests at concurrency 8 and up); 0: none")
    p.add_argument("--no-final-exactness", action="store_true",
                   help="skip the exactness checks after the runs (those before them still run)")
    p.add_argument("--kind", default="KIND_GPU")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--rows-type", default="", choices=["", "fp32", "fp16"],
                   help="the embeddings between lookup and network (default: fp16 with an fp16 network, else fp32)")
    p.add_argument("--no-ceiling", action="store_true")
    p.add_argument("--graphs", action="store_true", help="CUDA graphs for the dense network (ensemble step and single model)")
    p.add_argument("--one-instances", type=int, default=1,
                   help="instances of the single model (sharing one GPU cache of --cache-share, or each its own: "
                        "--cache-sharing)")
    p.add_argument("--cache-sharing", default="device", choices=["device", "instance"],
                   help="gpucache_sharing: one cache per GPU shared by the instances (HPS's way), or one per instance")
    p.add_argument("--cache-rows", default="", choices=["", "fp32", "fp16"],
                   help="gpucache_row_type: how the GPU caches keep their rows (default: fp16 when the embeddings "
                        "reach the network as fp16, whose answers are then the same bits; else fp32)")
    p.add_argument("--dlrm-interaction", default="split", choices=["cat", "split"],
                   help="DLRM's dot interaction in the TorchScript network: the 27 vectors stacked, or computed without "
                        "the stack (same numbers; split's network is ~0.9 ms faster at 65536 served, launch-bound eager "
                        "at small batches: graph those)")
    p.add_argument("--aoti-dlrm-interaction", default="triton", choices=["cat", "split", "triton"],
                   help="with --dense aoti: DLRM's interaction in the package; triton: one Triton kernel compiled into "
                        "it (examples/triton_kernels.py; the network 1.27 ms instead of 1.99 at 65536 on an H100)")
    p.add_argument("--dcnv2-cross", default="torch", choices=["torch", "triton"],
                   help="with --dense aoti: DCNv2's cross layers in the package as written, or each one Triton kernel "
                        "(examples/triton_kernels.py)")
    p.add_argument("--cross-config", default="",
                   help="with --dcnv2-cross triton: the kernel's tile, warps and stages (triton_kernels.cross_config, "
                        "e.g. 128x64x64w8s3)")
    p.add_argument("--shared-memory", default="system", choices=["system", "cuda"],
                   help="perf_analyzer's inputs in system shared memory (HPS's published runs), or in CUDA shared "
                        "memory: the keys and dense features already on the GPU, as the ceiling has them")
    p.add_argument("--key-upload", default="", help="PIECE,TASKS: the lookups' gpu_key_piece and gpu_key_upload_tasks "
                   "(default: the backend's own, 131072 keys on up to 8 tasks)")
    p.add_argument("--pipeline-parts", type=int, default=1,
                   help="the single model's recommender_pipeline_parts: large batches in parts, each part's lookup "
                        "beside the network on the part before (with --graphs, list the parts' rows in --graph-rows)")
    p.add_argument("--torch-param", action="append", default=[], metavar="KEY=VALUE",
                   help="a torch engine parameter for the network (the _dense and _one models), e.g. "
                        "TORCH_FUSION_STRATEGY=STATIC:20 (repeatable)")
    p.add_argument("--graph-rows", default="", help="with --graphs: graph only requests of these rows (e.g. 256,1024,4096)")
    p.add_argument("--host-memory", default="mapped", choices=["mapped", "huge_pages"],
                   help="the store's host_memory: rows read from the fixture's mapping, or copied into huge pages at load")
    p.add_argument("--interval-ms", type=int, default=3000)
    p.add_argument("--port", type=int, default=18900)
    p.add_argument("--libtorch-dir", default="")
    p.add_argument("--verbose", action="store_true", help="server --log-verbose=1: per-batch timing lines in server.log")
    p.add_argument("--cuda-pool-gb", type=int, default=4, help="tritonserver --cuda-memory-pool-byte-size for GPU 0")
    add_host_args(p)
    a = p.parse_args()
    # fp16 cache rows where the embeddings reach the network as fp16 (the same bits either way)
    a.cache_rows = a.cache_rows or (a.rows_type or ("fp16" if a.precision == "fp16" else "fp32"))
    apply_host_args(a)
    a.protocols = a.protocol.split(",")
    for proto in a.protocols:
        if proto not in ("grpc", "http", "grpc-streaming"):
            p.error(f"--protocol: {proto!r} is not grpc, http or grpc-streaming")
    a.stream_levels = [int(c) for c in a.stream_concurrency.split(",") if int(c) > 0]

    out_dir = os.path.join(os.environ.get("OUT", "/tmp/out"), "recsys")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    rows = fixture_rows(a.scale)
    models = [m for m in a.models.split(",") if m]
    batches = [int(b) for b in a.batches.split(",")]
    concs = [int(c) for c in a.concurrency.split(",")]
    # wide_deep's own plan: its batch sweep at concurrency 1, then its concurrency sweep if asked
    wd_plan = sweep_plan([int(b) for b in a.wide_deep_batches.split(",")], a.wide_deep_conc_batch, concs)
    wd_plan_batches = {b for b, _ in wd_plan}
    alphas = [float(x) for x in a.alphas.split(",")]
    params = sum(rows) * a.dim
    device = "cuda" if a.kind == "KIND_GPU" else "cpu"

    # 1. the fixture
    fixture = a.fixture
    if not fixture:
        need = sum(rows) * (8 + 2 * a.dim) * 1.02
        # one folder per shape of rows: a fixture of another dim or scale is not reused
        name = "criteo" if (a.scale, a.dim) == (0.8, 128) else f"criteo_s{a.scale}_d{a.dim}"
        if os.path.isdir("/dev/shm") and not os.path.isdir(os.path.join("/dev/shm", name)):
            # /dev/shm is RAM: fixtures of other shapes this script wrote there go first
            for other in sorted(os.listdir("/dev/shm")):
                if other.startswith("criteo") and other != name:
                    print(f"removing /dev/shm/{other} (another fixture) to make room", flush=True)
                    shutil.rmtree(os.path.join("/dev/shm", other), ignore_errors=True)
        shm_free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
        fixture = os.path.join("/dev/shm", name) if shm_free > need + (8 << 30) else os.path.join(a.work, name)
    done = os.path.join(fixture, f"t{TABLES - 1}", "vectors.npy")
    t0 = time.time()
    # the last table's rows exactly (an npy header is under 4 KiB)
    if not os.path.exists(done) or not 0 < os.path.getsize(done) - rows[-1] * a.dim * 2 < 4096:
        subprocess.run([a.fixture_bin, "--out", fixture, "--scale", str(a.scale), "--dim", str(a.dim),
                        "--seed", str(SEED), "--cache-share", str(a.cache_share)], check=True)
    if a.host_memory == "huge_pages" and available_memory() < sum(rows) * a.dim * 2 * 1.1 + (8 << 30):
        # the copy would not fit beside what is in RAM already (the fixture in /dev/shm counts)
        print(f"host_memory: {available_memory() / 1e9:.0f} GB available, too little for a huge-page copy of the rows; "
              "serving them mapped", flush=True)
        a.host_memory = "mapped"
    setup = {"tables": TABLES, "rows": sum(rows), "rows_per_table": rows, "dim": a.dim, "parameters": params,
             "table_gb_fp16": sum(rows) * a.dim * 2 / 1e9, "cache_share": a.cache_share,
             "allocation": a.allocation, "cached_rows_per_table": cache_rows(rows, a.cache_share, a.allocation),
             "cached_rows": sum(cache_rows(rows, a.cache_share, a.allocation)), "fixture": fixture,
             "graphs": a.graphs, "graph_rows": a.graph_rows, "host_memory": a.host_memory,
             "dlrm_interaction": a.dlrm_interaction, "one_instances": a.one_instances, "cache_sharing": a.cache_sharing,
             "cache_rows": a.cache_rows,
             "aoti_dlrm_interaction": a.aoti_dlrm_interaction, "dcnv2_cross": a.dcnv2_cross,
             "stationary_hit_rate": {str(x): stationary_hit_rate(rows, cache_rows(rows, a.cache_share, a.allocation), x) for x in alphas},
             "fixture_seconds": time.time() - t0, "precision": a.precision, "requests_per_pool": a.requests,
             "dense": a.dense}
    print(f"store: {TABLES} tables, {sum(rows):,} rows, {params / 1e9:.1f} B parameters, dim {a.dim}, "
          f"{setup['table_gb_fp16']:.1f} GB fp16 in {fixture}; GPU cache {setup['cached_rows']:,} rows "
          f"({setup['cached_rows'] / sum(rows):.1%}, {a.allocation}): {setup['cached_rows_per_table']}", flush=True)
    # aoti_report.py reads this line: without it (runs before gpucache_sharing) each instance had its own
    print(f"GPU caches: {'one per GPU, shared by the single model' if a.cache_sharing == 'device' else 'one per instance of the single model'}"
          f"'s {a.one_instances} instance(s), rows kept as {a.cache_rows}", flush=True)
    cached = cache_rows(rows, a.cache_share, a.allocation)
    plans = {x: pool_plan(rows, cached, x, 1, a.hit_rate_bound) for x in alphas}
    setup["lru_hit_rate"] = {str(x): plans[x]["lru"] for x in alphas}
    setup["pool_needed_lookups_per_table"] = {str(x): plans[x]["needed_lookups"] for x in alphas}
    for x, h in setup["stationary_hit_rate"].items():
        print(f"  stationary hit rate at alpha {x} (an endless stream, this cache holding the hottest keys): {h:.4f}; "
              f"the same stream through this LRU cache (Che's approximation): {plans[float(x)]['lru']:.4f}", flush=True)

    # 2. keys: a pool of distinct requests per (batch, alpha)
    pools = {}
    pool_sizes = {}

    def pool_size(batch, alpha):
        """Distinct requests in the pool of (batch, alpha), said once per pool."""
        if (batch, alpha) in pool_sizes:
            return pool_sizes[(batch, alpha)]
        plan = plans[alpha]
        if a.requests != "auto":
            # perf_analyzer reads the whole pool as JSON: fewer distinct requests at the largest batches
            n = int(a.requests)
            n = n if batch <= 4096 else max(4, n // (2 if batch <= 16384 else 4))
        else:
            need = max(16, int(np.ceil(plan["needed_lookups"] / batch)))
            cap = max(4, int(a.pool_gb * 1e9 // (batch * (TABLES * 8 + 13 * 4))))
            n = min(need, cap)
        need_n = int(np.ceil(plan["needed_lookups"] / batch))
        predicted = predicted_pool_rate(plan, n * batch)
        gap = predicted - plan["lru"]
        print(f"  key pool at batch {batch}, alpha {alpha}: {n} distinct requests ({n * batch:,} lookups per table, "
              f"{n * batch * (TABLES * 8 + 13 * 4) / 1e9:.2f} GB); the stream's hit rate needs >= {need_n} "
              f"({plan['needed_lookups']:.3g} lookups per table: twice the largest LRU characteristic time); "
              f"expected measured rate {predicted:.4f} vs the stream's {plan['lru']:.4f} "
              f"({'within' if abs(gap) <= a.hit_rate_bound else 'NOT within'} {a.hit_rate_bound})", flush=True)
        pool_sizes[(batch, alpha)] = n
        return n

    def requests_of(batch, alpha):
        if (batch, alpha) not in pools:
            t0 = time.time()
            pools[(batch, alpha)] = zipf_keys.make_requests(rows, batch, pool_size(batch, alpha), alpha,
                                                            seed=int(batch * 10 + alpha * 100))
            if time.time() - t0 > 5:
                print(f"  (pool of batch {batch}, alpha {alpha} drawn in {time.time() - t0:.0f} s)", flush=True)
        return pools[(batch, alpha)]

    def data_file(batch, alpha):
        path = os.path.join(a.work, f"keys_b{batch}_a{alpha}_n{pool_size(batch, alpha)}.json")
        if not os.path.exists(path):
            # written a request at a time: a large pool is never one string in memory
            with open(path + ".tmp", "w") as f:
                f.write('{"data": [')
                for i, (s, d) in enumerate(requests_of(batch, alpha)):
                    f.write(("," if i else "") + json.dumps({"sparse": {"b64": zipf_keys.b64(s), "shape": list(s.shape)},
                                                            "dense": {"b64": zipf_keys.b64(d), "shape": list(d.shape)}}))
                f.write("]}")
            os.replace(path + ".tmp", path)
        return path

    repo = os.path.join(a.work, "repo")
    shutil.rmtree(repo, ignore_errors=True)
    rows_type = {"fp16": "TYPE_FP16", "fp32": "TYPE_FP32"}[a.rows_type or ("fp16" if a.precision == "fp16" else "fp32")]
    print(f"embeddings between lookup and network: {rows_type}", flush=True)
    setup["rows_type"] = rows_type
    setup["pipeline_parts"] = a.pipeline_parts
    setup["shared_memory"] = a.shared_memory
    setup["key_upload"] = a.key_upload or "backend default"
    ceilings, bare_aoti = {}, {}
    for m in models:
        mod = dense_module(m, a.precision, device, a.dlrm_interaction)
        pt = os.path.join(a.work, f"{m}_dense.pt")
        mod.save(pt)
        all_batches = sorted(wd_plan_batches if m == "wide_deep" else set(batches) | {a.conc_batch})
        pt2 = export_aoti(m, a, rows_type, max(all_batches)) if a.dense == "aoti" else None
        write_models(repo, m, pt, fixture, a.dim, a.cache_share, a.kind, a.allocation, a.graphs, a.host_memory,
                     [int(r) for r in a.graph_rows.split(",") if r], a.one_instances, rows_type, a.pipeline_parts,
                     tuple(int(x) for x in a.key_upload.split(",")) if a.key_upload else None,
                     [tuple(kv.split("=", 1)) for kv in a.torch_param], one_pt2=pt2,
                     hit_rate_threshold=a.hit_rate_threshold, cache_sharing=a.cache_sharing,
                     cache_rows_type=a.cache_rows)
        if device == "cuda" and not a.no_ceiling:
            print(f"ceiling: {m} bare in torch, every table in HBM ({setup['table_gb_fp16']:.1f} GB fp16; "
                  "the TorchScript network)", flush=True)
            # a few requests of each pool: the ceiling cycles them
            ceilings[m] = ceiling(m, mod, rows, a.dim, all_batches, lambda b: requests_of(b, alphas[0])[:16])
        if pt2 and a.aoti_bare:
            bare_aoti[m] = aoti_bare_figures(a.aoti_bare, pt2, all_batches)
        del mod
    with open(os.path.join(out_dir, "ceiling.json"), "w") as f:
        json.dump(ceilings, f, indent=1)
    if bare_aoti:
        with open(os.path.join(out_dir, "bare_aoti.json"), "w") as f:
            json.dump(bare_aoti, f, indent=1)

    # 3.-5. the server
    runs, streams = [], []
    log_path = os.path.join(out_dir, "server.log")
    # Triton's GPU memory pool holds the ensemble's intermediate tensors (the embeddings,
    # 872 MB per request at batch 65536); its 64 MB default sends them through host memory
    extra = [f"--cuda-memory-pool-byte-size=0:{a.cuda_pool_gb << 30}"] if device == "cuda" else []
    if a.verbose:
        extra.append("--log-verbose=1")
    if a.libtorch_dir:
        extra.append(f"--backend-config=rust,libtorch-dir={a.libtorch_dir}")
    t0 = time.time()
    with serve(a.server, repo, a.backends, a.port, log_path, extra=extra, timeout=1800) as client:
        setup["server_ready_seconds"] = time.time() - t0
        print(f"server ready in {setup['server_ready_seconds']:.0f} s", flush=True)
        # cold caches: every key misses and fills; then the same keys again, now hits
        for m in models:
            for when in ("cold", "warm"):
                e = exactness(client, m, rows, a.dim, requests_of(a.conc_batch, alphas[0])[:1])
                print(f"  exactness {m} ({when} cache): {e}", flush=True)
                if exactness_problems(e, a.prediction_bound):
                    raise SystemExit(f"{m}: " + "; ".join(exactness_problems(e, a.prediction_bound)))
            if a.shared_memory == "cuda":
                # the path the runs below take: keys from CUDA shared memory, read on the GPU
                e = exactness_cuda_shm(client, m, a.dim, requests_of(a.conc_batch, alphas[0])[1:2])
                print(f"  exactness {m} (keys in CUDA shared memory): {e}", flush=True)
                if e["rows_max_abs_diff"] != 0.0:
                    raise SystemExit(f"served rows differ from the fixture's for {m}, keys in CUDA shared memory")
        for alpha_i, alpha in enumerate(alphas):
            sweep = batches if alpha_i == 0 else [int(b) for b in a.other_alpha_batches.split(",")]
            plan = sweep_plan(sweep, a.conc_batch if alpha_i == 0 else 0, concs)
            for m in models:
                if m == "wide_deep":
                    # its seed: a batch sweep at concurrency 1 (issue 8's figure is batch 131072),
                    # and requests of 2048 rows at growing concurrency; the first alpha only
                    if alpha_i > 0:
                        continue
                    plan_m = wd_plan
                else:
                    plan_m = plan
                for batch, conc in plan_m:
                    data = data_file(batch, alpha)
                    for path, proto in [(x, y) for x in a.paths.split(",") for y in a.protocols]:
                        model = f"{m}_{path}"
                        composing = [f"{m}_sparse", f"{m}_dense"] if path == "ens" else [model]
                        st0 = model_stats(client, composing)
                        started = time.time()
                        tag = f"{m}_{path}_a{alpha}" + ("" if proto == "grpc" else f"_{proto}")
                        r = perf(a.perf_analyzer, a.port, model, batch, conc, data, out_dir, tag,
                                 f"{m}_sparse", a.interval_ms, a.shared_memory, proto)
                        if r is None:
                            continue
                        # wall-clock span, to line the run up with run.sh's vmstat and GPU samples
                        r["started"], r["ended"] = started, time.time()
                        r["per_model_ms"] = per_model(st0, model_stats(client, composing))
                        ceil = ceilings.get(m, {}).get(batch) or ceilings.get(m, {}).get(str(batch))
                        best = max(x for x in (ceil or {}).values() if x) if ceil else None
                        lru = plans[alpha]["lru"]
                        r.update({"model": m, "path": path, "alpha": alpha, "batch": batch, "concurrency": conc,
                                  "ceiling_ips": best, "pool_requests": pool_size(batch, alpha), "protocol": proto,
                                  "stationary_hit_rate": setup["stationary_hit_rate"][str(alpha)], "lru_hit_rate": lru,
                                  "dense": "aoti" if path == "one" and a.dense == "aoti" else "torchscript"})
                        aoti_net = (bare_aoti.get(m) or {}).get(batch)
                        if path == "one" and aoti_net:
                            r["bare_aoti_network"] = aoti_net
                        runs.append(r)
                        hr = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.3f}"
                        ratio = f"{r['Inferences/Second'] / best:.2f}" if best else "-"
                        print(f"  {model:<10} a={alpha:<4} b={batch:<6} c={conc:<2} {r['Inferences/Second'] / 1e6:7.2f} M inf/s  "
                              f"p99 {r['p99 latency'] / 1e3:8.2f} ms  hit rate {hr}  {r['keys_per_s'] / 1e6:7.1f} M keys/s  "
                              f"served/ceiling {ratio}" + ("" if proto == "grpc" else f"  over {proto}"), flush=True)
                        print("      per execution (ms): " + "; ".join(
                            f"{k}: " + ", ".join(f"{x} {v:.2f}" for x, v in d.items()) for k, d in r["per_model_ms"].items())
                            + (f"; the package's network alone (aoti_bare): {aoti_net['plain_p50_ms']:.2f} ms, "
                               f"CUDA graph {aoti_net['graph_p50_ms'] or float('nan'):.2f} ms" if r.get("bare_aoti_network") else ""),
                            flush=True)
                        if r["hit_rate"] is not None:
                            gap = r["hit_rate"] - lru
                            print(f"      hit rate {r['hit_rate']:.4f} measured over a pool of {r['pool_requests']} requests; "
                                  f"the endless stream's: {lru:.4f} through this LRU cache, "
                                  f"{r['stationary_hit_rate']:.4f} holding the hottest keys; measured - stream "
                                  f"{gap_text(gap, a.hit_rate_bound)}", flush=True)
                        with open(os.path.join(out_dir, "runs.json"), "w") as f:
                            json.dump(runs, f, indent=1)
                if a.stream_levels and "one" in a.paths.split(","):
                    for batch in sorted({b for b, _ in plan_m}):
                        stream_check(a, m, batch, alpha, rows, plans[alpha], streams, out_dir)
        exact = {}
        for m in models if not a.no_final_exactness else []:
            # distinct requests of one size, one more than the single model's instances: some
            # instance serves two, the second with its CUDA graph for that size captured, so on
            # a GPU its lookup writes straight into the graph's input (run_in_graph_input)
            n = max(4, a.one_instances + 1)
            exact[m] = exactness(client, m, rows, a.dim, requests_of(a.conc_batch, alphas[-1])[:n])
            print(f"  exactness {m}: {exact[m]}", flush=True)
            # one request of the largest batch (capped at 65536 rows: 872 MB of rows back
            # through gRPC): its keys go up in pieces on several threads (BatchLookup::run)
            big = min(65536, max(wd_plan_batches) if m == "wide_deep" else max(batches))
            e = exactness(client, m, rows, a.dim, requests_of(big, alphas[0])[:1], batch=big)
            exact[m]["largest_batch"] = dict(e, batch=big)
            print(f"  exactness {m} (one request of {big} rows): {e}", flush=True)
            if a.shared_memory == "cuda":
                e = exactness_cuda_shm(client, m, a.dim, requests_of(big, alphas[0])[:1], batch=big)
                exact[m]["cuda_shm"] = dict(e, batch=big)
                print(f"  exactness {m} (one request of {big} rows, keys in CUDA shared memory): {e}", flush=True)
    with open(os.path.join(out_dir, "exact.json"), "w") as f:
        json.dump(exact, f, indent=1)
    with open(os.path.join(out_dir, "setup.json"), "w") as f:
        json.dump(setup, f, indent=1)
    bad = {m: p for m, e in exact.items()
           if (p := [x for part in (e, e["largest_batch"], e.get("cuda_shm", {}))
                     for x in exactness_problems(part, a.prediction_bound)])}
    if bad:
        raise SystemExit("; ".join(f"{m}: {', '.join(p)}" for m, p in bad.items()))


if __name__ == "__main__":
    main()
