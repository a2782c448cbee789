#!/usr/bin/env python3
"""Writes embedding tables in libtriton_rust's store format (and HugeCTR's).

Our format, one directory per table:
    keys.npy     int64   [rows]
    vectors.npy  float32 (or float16) [rows, dim]
HugeCTR/HPS format (``--hugectr``): raw little-endian ``key`` (int64) and
``emb_vector`` (float32, dim per key) files, as HugeCTR writes ``*_sparse_*.model``.

Random rows from a fixed seed. ``--criteo`` writes the 26 tables of the MLPerf
DLRMv2 Criteo-1TB layout, scaled by ``--scale`` (1.0 = the real sizes, ~24 B rows*dims),
for GPU runs; see docs/embedding-store.md for the sizes.

    python examples/make_tables.py --out DIR --tables t0:1000:16,t1:500:32 [--fp16] [--hugectr]
    python examples/make_tables.py --out DIR --criteo --scale 0.01 --dim 128
"""
import argparse
import os
import sys

import numpy as np

# MLPerf DLRMv2 (Criteo 1TB, multi-hot) table sizes: 26 tables, four of 40 M rows.
CRITEO_1TB_ROWS = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
]


def write_table(out_dir, name, rows, dim, seed, dtype=np.float32, hugectr=False, scale=0.05):
    rng = np.random.default_rng(seed)
    keys = np.arange(rows, dtype=np.int64)
    path = os.path.join(out_dir, name)
    os.makedirs(path, exist_ok=True)
    # write in chunks so large tables never need two copies in memory
    chunk = max(1, (64 << 20) // (dim * 4))
    if hugectr:
        keys.tofile(os.path.join(path, "key"))
        with open(os.path.join(path, "emb_vector"), "wb") as f:
            for start in range(0, rows, chunk):
                n = min(chunk, rows - start)
                (rng.standard_normal((n, dim), dtype=np.float32) * scale).astype(np.float32).tofile(f)
        return path
    np.save(os.path.join(path, "keys.npy"), keys)
    vec_path = os.path.join(path, "vectors.npy")
    mm = np.lib.format.open_memmap(vec_path, mode="w+", dtype=dtype, shape=(rows, dim))
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        mm[start:start + n] = (rng.standard_normal((n, dim), dtype=np.float32) * scale).astype(dtype)
    mm.flush()
    del mm
    return path


def read_table(path):
    """Returns (keys, vectors as float32) of a table in either format."""
    if os.path.exists(os.path.join(path, "keys.npy")):
        return np.load(os.path.join(path, "keys.npy")), np.load(os.path.join(path, "vectors.npy"), mmap_mode="r")
    keys = np.fromfile(os.path.join(path, "key"), dtype=np.int64)
    vecs = np.fromfile(os.path.join(path, "emb_vector"), dtype=np.float32).reshape(len(keys), -1)
    return keys, vecs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--tables", help="name:rows:dim,...")
    p.add_argument("--criteo", action="store_true", help="the 26 Criteo-1TB tables (names t0..t25)")
    p.add_argument("--scale", type=float, default=1.0, help="row-count scale for --criteo")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--hugectr", action="store_true")
    p.add_argument("--seed", type=int, default=2024)
    a = p.parse_args(argv)
    if a.criteo:
        specs = [(f"t{i}", max(1, int(r * a.scale)), a.dim) for i, r in enumerate(CRITEO_1TB_ROWS)]
    elif a.tables:
        specs = [(n, int(r), int(d)) for n, r, d in (t.split(":") for t in a.tables.split(","))]
    else:
        p.error("give --tables or --criteo")
    dtype = np.float16 if a.fp16 else np.float32
    total = 0
    for i, (name, rows, dim) in enumerate(specs):
        write_table(a.out, name, rows, dim, a.seed + i, dtype, a.hugectr)
        total += rows * dim * np.dtype(dtype).itemsize
        print(f"{name}: {rows} rows x {dim}")
    print(f"total {total / 1e9:.3f} GB of vectors in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
