#!/usr/bin/env python3
"""Pooled (multi-hot) lookups on a GPU instance of the real tritonserver: rows exact against a
float64 sum of the stored rows (issue 46). Needs an NVIDIA GPU; run through
`bash bench/gpu/run.sh pooled-check` (carry .carry).

Writes tables several times larger than their GPU cache (so bags mix cache hits and rows
fetched from the host tier), serves them as pooled models on KIND_GPU (sum with fixed hotness
and -1 padding, mean, FP16 rows, and the ragged form: KEYS with allow_ragged_batch and LENGTHS),
and checks every answer against numpy's float64 pooling of the table files: fp32 rows within
1e-5 relative, fp16 rows within fp16's rounding. The same models with every row on the GPU
(gpucacheper 1.0: resident tables, one kernel from the keys as sent; fp32 and fp16 rows kept)
are checked alike, with keys that are no row of their table (past the table: the
batch read below the GPU, default rows) and keys sent in CUDA shared memory. The cached models
also take keys in CUDA shared memory: full bags (looked up as sent, pooled on the GPU), padded
bags (the host-side bags) and a key of -5 (a 400 naming KEYS). Then times requests of MLPerf DLRM-v2's hotness
(214 keys a sample) through the server and prints lookups/s, labelled as a served figure
(HTTP, the pooled rows returned to the client), not the lookup alone."""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
from kserve_client import Client, InferError  # noqa: E402
from tritonserver_process import serve  # noqa: E402
from make_tables import write_table  # noqa: E402

HOTNESS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]  # MLPerf DLRM-v2


def param(k, v):
    return f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'


def config(name, tables, dim, hotness, table_dir, combiner, out_type="TYPE_FP32", ragged=False, cache=0.1,
           max_batch=4096, row_type="fp32", miss_reads="cpu"):
    width = sum(hotness)
    keys = ('input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true },\n'
            f'        {{ name: "LENGTHS" data_type: TYPE_INT32 dims: [ {tables} ] }} ]\n') if ragged else \
        f'input [ {{ name: "KEYS" data_type: TYPE_INT64 dims: [ {width} ] }} ]\n'
    text = (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: {max_batch}\n{keys}'
            f'output [ {{ name: "OUTPUT0" data_type: {out_type} dims: [ {tables}, {dim} ] }} ]\n'
            'instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]\n'
            'dynamic_batching { max_queue_delay_microseconds: 100 }\n')
    for k, v in dict(engine="embedding", embedding_interface="pooled",
                     embedding_table_names=",".join(f"t{i}" for i in range(tables)),
                     embedding_vecsize_per_table=dim, embedding_hotness_per_table=",".join(map(str, hotness)),
                     embedding_combiner=combiner, gpucacheper=cache, gpucache_row_type=row_type,
                     gpucache_miss_reads=miss_reads,
                     sparse_files=",".join(
                         os.path.join(table_dir, f"t{i}") for i in range(tables))).items():
        text += param(k, v)
    return text


def fixed_keys(rng, batch, hotness, rows, empty=0.15):
    keys = np.full((batch, sum(hotness)), -1, dtype=np.int64)
    for b in range(batch):
        at = 0
        for h in hotness:
            n = 0 if rng.random() < empty else int(rng.integers(1, h + 1))
            keys[b, at:at + n] = rng.integers(0, rows, size=n)
            at += h
    return keys


def reference_fixed(vectors, keys, hotness, mean):
    out = np.zeros((keys.shape[0], len(hotness), vectors[0].shape[1]), np.float64)
    at = 0
    for t, h in enumerate(hotness):
        for b in range(keys.shape[0]):
            bag = [k for k in keys[b, at:at + h] if k != -1]
            if bag:
                s = vectors[t][bag].astype(np.float64).sum(0)
                out[b, t] = s / len(bag) if mean else s
        at += h
    return out


def reference_rounded(vectors, keys, hotness):
    """reference_fixed (sum) of the rows rounded to fp16, as a cache of fp16 rows keeps them."""
    return reference_fixed([v.astype(np.float16).astype(np.float32) for v in vectors], keys, hotness, False)


def resident_extras(c, vectors, rows, failures):
    """Resident tables: keys that are no row (the batch answered below the GPU, default rows
    of zeros) and keys sent in CUDA shared memory (read where they are)."""
    rng = np.random.default_rng(7)
    keys = fixed_keys(rng, 64, HOTNESS, rows, empty=0.0)
    keys[3, 0] = rows + 5  # past table 0
    keys[9, 50] = rows + 1000  # past table 20 (negative keys other than -1 are refused with a 400)
    out = c.infer("resident_sum", {"KEYS": keys}, ["OUTPUT0"])["OUTPUT0"].astype(np.float64)
    masked = keys.copy()
    masked[3, 0], masked[9, 50] = -1, -1  # default rows are zeros: the bags as if those keys were padding
    want = reference_fixed(vectors, masked, HOTNESS, False)
    diff = float(np.abs(out - want).max())
    print(f"  resident_sum   keys no row of their table (past tables 0 and 20): max abs diff {diff:.2e} "
          "against bags without them (default rows are zeros)")
    if diff > 1e-4:
        failures.append(f"resident_sum with keys outside the tables: max abs diff {diff:.3e}")
    from cuda_shm import Region
    keys = fixed_keys(rng, 512, HOTNESS, rows)
    with Region(c, "pooled_keys", keys.nbytes) as region:
        region.write(keys)
        out = c.infer("resident_fp16", {}, ["OUTPUT0"],
                      shm={"KEYS": (region.name, 0, keys.nbytes, keys.shape, np.int64)})["OUTPUT0"].astype(np.float64)
    want = reference_rounded(vectors, keys, HOTNESS)
    bad = np.abs(out - want) > np.abs(want) * 2.0 ** -10 + 1e-6
    print(f"  resident_fp16  keys in CUDA shared memory, 512 samples: max abs diff {float(np.abs(out - want).max()):.2e}")
    if bad.any():
        failures.append(f"resident_fp16 with keys in CUDA shared memory: {int(bad.sum())} values off")


def cached_gpu_keys(c, vectors, rows, failures):
    """Tables cached at 10% with the keys in CUDA shared memory: full bags are looked up as sent
    and pooled on the GPU (sum and mean); padding takes the host-side bags; a negative key
    other than -1 is refused with a 400 naming the input, and the next request is answered."""
    from cuda_shm import Region
    rng = np.random.default_rng(11)
    full = np.concatenate([rng.integers(0, rows, size=(300, h)) for h in HOTNESS], axis=1).astype(np.int64)
    padded = fixed_keys(rng, 300, HOTNESS, rows)
    bad = full[:4].copy()
    bad[2, 7] = -5
    cases = (("pooled_sum", full, "every bag full: looked up as sent"), ("pooled_mean", full, "every bag full, mean"),
             ("cached_fp16", full, "every bag full, fp16 rows and out"),
             ("cached_gpu_reads", full, "every bag full, fp16 rows and out, misses read by the GPU"),
             ("pooled_sum", padded, "padding: the host-side bags"),
             ("cached_gpu_reads", padded, "padding: the host-side bags, misses read by the GPU"))
    for name, keys, what in cases:
        for rep in range(2):  # the second finds the cache warm
            with Region(c, f"cached_keys_{rep}", keys.nbytes) as region:
                region.write(keys)
                out = c.infer(name, {}, ["OUTPUT0"],
                              shm={"KEYS": (region.name, 0, keys.nbytes, keys.shape, np.int64)})["OUTPUT0"]
            if name in ("cached_fp16", "cached_gpu_reads"):  # rows kept as fp16, the sum rounded to fp16
                want = reference_rounded(vectors, keys, HOTNESS)
                off = np.abs(out.astype(np.float64) - want) > np.abs(want) * 2.0 ** -10 + 1e-6
            else:
                want = reference_fixed(vectors, keys, HOTNESS, name == "pooled_mean")
                off = np.abs(out.astype(np.float64) - want) > np.abs(want) * 1e-5 + 1e-6
            if off.any():
                failures.append(f"{name}, keys in CUDA shared memory ({what}): {int(off.sum())} values off")
        print(f"  {name:14s} keys in CUDA shared memory, {what}, {keys.shape[0]} samples: "
              f"max abs diff {float(np.abs(out.astype(np.float64) - want).max()):.2e}")
    with Region(c, "cached_bad_keys", bad.nbytes) as region:
        region.write(bad)
        try:
            c.infer("pooled_sum", {}, ["OUTPUT0"], shm={"KEYS": (region.name, 0, bad.nbytes, bad.shape, np.int64)})
            failures.append("a key of -5 in CUDA shared memory was answered")
        except InferError as e:
            print(f"  pooled_sum     a key of -5 in CUDA shared memory refused: [{e.status}] {str(e)[:120]}")
            if e.status != 400 or "KEYS" not in str(e):
                failures.append(f"a key of -5 in CUDA shared memory: [{e.status}] {e}")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--work", default="/tmp/pooled_check")
    p.add_argument("--rows", type=int, default=200_000, help="rows per table")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--port", type=int, default=18600)
    p.add_argument("--perf-batch", type=int, default=512, help="samples a request in the timed part")
    p.add_argument("--perf-seconds", type=float, default=10.0)
    a = p.parse_args()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print(f"GPU: {gpu}")
    tables, dim = len(HOTNESS), a.dim
    repo = os.path.join(a.work, "repo")
    t0 = time.time()
    for i in range(tables):
        if not os.path.exists(os.path.join(a.work, "tables", f"t{i}", "vectors.npy")):
            write_table(os.path.join(a.work, "tables"), f"t{i}", a.rows, dim, seed=500 + i)
    vectors = [np.load(os.path.join(a.work, "tables", f"t{i}", "vectors.npy"), mmap_mode="r") for i in range(tables)]
    print(f"tables: {tables} x {a.rows:,} rows x dim {dim} ({tables * a.rows * dim * 4 / 1e9:.2f} GB, "
          f"{time.time() - t0:.0f} s to write), GPU cache 10% of each; hotness {sum(HOTNESS)} keys a sample")
    models = {"pooled_sum": dict(combiner="sum"), "pooled_mean": dict(combiner="mean"),
              "pooled_fp16": dict(combiner="sum", out_type="TYPE_FP16"),
              # a 10% cache keeping fp16 rows
              "cached_fp16": dict(combiner="sum", out_type="TYPE_FP16", row_type="fp16"),
              # the same, its misses read by the GPU in place from the tables' host rows (fp32)
              "cached_gpu_reads": dict(combiner="sum", out_type="TYPE_FP16", row_type="fp16", miss_reads="gpu"),
              # the misses shared: the GPU's share read in place, the rest by host threads
              "cached_both_reads": dict(combiner="sum", out_type="TYPE_FP16", row_type="fp16", miss_reads="both"),
              "pooled_ragged": dict(combiner="sum", ragged=True),
              # every row on the GPU: resident tables, pooled by one kernel
              "resident_sum": dict(combiner="sum", cache=1.0), "resident_mean": dict(combiner="mean", cache=1.0),
              "resident_fp16": dict(combiner="sum", out_type="TYPE_FP16", cache=1.0, row_type="fp16"),
              "resident_ragged": dict(combiner="sum", ragged=True, cache=1.0)}
    for name, kw in models.items():
        os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(config(name, tables, dim, HOTNESS, os.path.join(a.work, "tables"), **kw))
    failures = []
    with serve(a.server, repo, a.backends, a.port, os.path.join(a.work, "server.log"), timeout=600) as c:
        for line in open(os.path.join(a.work, "server.log")):
            if "ready on Gpu" in line:
                print("[server]", line.strip()[-110:])
        rng = np.random.default_rng(1)
        for name, kw in models.items():
            worst, rows_checked = 0.0, 0
            for rep, batch in enumerate((1, 33, 256, 256)):  # the repeats find the cache warm
                if kw.get("ragged"):
                    lengths = rng.integers(0, 2 * np.array(HOTNESS) + 1, size=(1, tables)).astype(np.int32)
                    keys = rng.integers(0, a.rows, size=int(lengths.sum())).astype(np.int64)
                    out = c.infer(name, {"KEYS": keys.reshape(1, -1), "LENGTHS": lengths}, ["OUTPUT0"])["OUTPUT0"]
                    want, at = np.zeros((1, tables, dim)), 0
                    for t, n in enumerate(lengths[0]):
                        want[0, t] = vectors[t][keys[at:at + n]].astype(np.float64).sum(0)
                        at += n
                else:
                    keys = fixed_keys(rng, batch, HOTNESS, a.rows)
                    out = c.infer(name, {"KEYS": keys}, ["OUTPUT0"])["OUTPUT0"]
                    want = reference_fixed(vectors, keys, HOTNESS, kw["combiner"] == "mean")
                got = out.astype(np.float64)
                if kw.get("row_type") == "fp16":
                    # rows kept as fp16: the reference sums the rows rounded to fp16
                    want = reference_rounded(vectors, keys, HOTNESS) if not kw.get("ragged") else want
                if kw.get("out_type") == "TYPE_FP16":
                    bad = np.abs(got - want) > np.abs(want) * 2.0 ** -10 + 1e-6  # fp16 rounding of the sum
                else:
                    bad = np.abs(got - want) > np.abs(want) * 1e-5 + 1e-6
                worst = max(worst, float(np.abs(got - want).max()))
                rows_checked += int(np.prod(out.shape[:2]))
                if bad.any():
                    failures.append(f"{name} batch {batch}: {int(bad.sum())} values off, max abs diff {worst:.3e}")
            print(f"  {name:14s} {rows_checked:6d} pooled rows against float64 sums of the stored rows: "
                  f"max abs diff {worst:.2e}")
        resident_extras(c, vectors, a.rows, failures)
        cached_gpu_keys(c, vectors, a.rows, failures)
        for line in open(os.path.join(a.work, "server.log")):
            if "resident" in line and ("error" in line.lower() or "fit" in line):
                print("[server]", line.strip()[-160:])
        # malformed input fails alone, the GPU instance goes on
        try:
            c.infer("pooled_ragged", {"KEYS": np.zeros((1, 3), np.int64), "LENGTHS": np.array([[2] + [0] * (tables - 1)], np.int32)}, ["OUTPUT0"])
            failures.append("LENGTHS summing to 2 for 3 keys was answered")
        except InferError as e:
            print(f"  bad LENGTHS refused: [{e.status}] {str(e)[:150]}")
        # served lookups/s at MLPerf DLRM-v2's hotness (every bag full)
        keys = np.stack([np.concatenate([rng.integers(0, a.rows, size=h) for h in HOTNESS]) for _ in range(a.perf_batch)])
        for model in ("pooled_fp16", "resident_fp16"):
            c.infer(model, {"KEYS": keys}, ["OUTPUT0"])
            n, t0 = 0, time.time()
            while time.time() - t0 < a.perf_seconds / 2:
                c.infer(model, {"KEYS": keys}, ["OUTPUT0"])
                n += 1
            secs = time.time() - t0
            lookups = n * a.perf_batch * sum(HOTNESS)
            print(f"  {model}: served, one HTTP client, batch {a.perf_batch} x {sum(HOTNESS)} keys, fp16 rows back: "
                  f"{n / secs:.1f} requests/s, {lookups / secs / 1e6:.1f} M lookups/s "
                  f"(the server's path and HTTP, not the pooled lookup alone)")
    for f in failures:
        print("FAIL", f)
    print("pooled_check: " + ("every check passed" if not failures else f"{len(failures)} failures"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
