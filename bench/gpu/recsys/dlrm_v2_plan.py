"""What bench/gpu/dlrm_v2_perf.py measures with: the GPU cache's plan (each table's slots and hit
rates, weighted by hotness), the pairs drawn under the Zipf law, and the key pools perf_analyzer
cycles (--input-data JSON files)."""
import json
import os

import numpy as np

import zipf_keys

from .cache import cache_rows, lru_table, stationary_hit_rate
from .dlrm_v2_model import HOT, QUERY, START, WIDTH


def mlperf_sizes(spec, rng, n):
    """`n` query sizes in pairs: LO-HI uniform over LO..HI, or drawn uniformly from a list."""
    if "-" in spec:
        lo, hi = (int(x) for x in spec.split("-"))
        return rng.integers(lo, hi + 1, size=n), f"uniform over {lo}..{hi} pairs (mean {(lo + hi) / 2:.0f})"
    choices = np.array([int(x) for x in spec.split(",")])
    return rng.choice(choices, size=n), f"drawn uniformly from {list(map(int, choices))} (mean {choices.mean():.0f})"


def cache_plan(rows, share, allocation, alpha, bound):
    """Per table: rows, cache slots, hotness, the stationary hit rate (the hottest keys cached),
    an LRU cache's rate on the endless stream (Che) and its characteristic time T (lookups).
    Weighted by hotness (every pair looks up HOT[t] keys of table t, so the server's hit rate,
    hits over keys of all tables, weighs each table so). `need_pairs`: the pairs an endless
    stream's pool must hold for its measured rate to be the LRU rate (pool_plan's 2 T on every
    table whose misses count, here T / HOT[t] pairs per T lookups)."""
    cached = cache_rows(rows, share, allocation, HOT)
    tables = []
    for n, c, h in zip(rows, cached, HOT):
        t_char, lru = lru_table(n, c, alpha)
        tables.append({"rows": n, "cached": c, "hotness": h, "stationary": stationary_hit_rate([n], [c], alpha),
                       "lru": lru, "T": t_char})
    weighted = lambda key: sum(t["hotness"] * t[key] for t in tables) / WIDTH  # noqa: E731
    counted = [t for t in tables if t["T"] != float("inf") and t["hotness"] * (1 - t["lru"]) / WIDTH > bound / 10]
    need = max((2 * t["T"] / t["hotness"] for t in counted), default=0.0)
    return {"cached_per_table": cached, "stationary": weighted("stationary"), "lru": weighted("lru"),
            "need_pairs": need, "tables": [{k: (None if v == float("inf") else v) for k, v in t.items()} for t in tables]}


def expected_pool_rate(plan, pairs):
    """The rate a cyclic pool of `pairs` pairs measures: a table whose pool lookups reach 2 T has
    the LRU rate, a smaller one fits in the cache whole and hits (recsys/cache.py's pool_plan)."""
    rates = [t["lru"] if t["T"] is not None and pairs * t["hotness"] >= 2 * t["T"] else 1.0 for t in plan["tables"]]
    return sum(h * r for h, r in zip(HOT, rates)) / WIDTH


def draw_pairs(rows, n, alpha, seed):
    """`n` pairs: sparse int64 [n, 214], every bag full, each table's keys Zipf over its rows
    (zipf_keys' law and rank-to-key map); dense float32 [n, 13]."""
    rng = np.random.default_rng(seed)
    sparse = np.empty((n, WIDTH), np.int64)
    for t, (r, h) in enumerate(zip(rows, HOT)):
        sparse[:, START[t]:START[t] + h] = zipf_keys.spread(zipf_keys.zipf_ranks(rng, r, alpha, n * h), r).reshape(n, h)
    return sparse, rng.random((n, 13), dtype=np.float32)


def write_pool(path, steps):
    """perf_analyzer's --input-data JSON: one step per dict of {input: array} (its shape is the
    array's: one pair [214] for a batching model, a whole query [n, 214] for the twin)."""
    with open(path + ".tmp", "w") as f:
        f.write('{"data": [')
        for i, step in enumerate(steps):
            f.write(("," if i else "") + json.dumps(
                {k: {"b64": zipf_keys.b64(v), "shape": list(v.shape)} for k, v in step.items()}))
        f.write("]}")
    os.replace(path + ".tmp", path)
    return path


def pools(a, rows, setup):
    """The key pools perf_analyzer cycles: {name: (file, description)}."""
    out = {}
    os.makedirs(a.work, exist_ok=True)
    s, d = draw_pairs(rows, a.pool_samples, a.alpha, seed=270)
    out["fixed270"] = (write_pool(os.path.join(a.work, "pool_pairs.json"),
                                  ({"sparse": s[i], "dense": d[i]} for i in range(len(s)))),
                       f"-b 270 runs: {a.pool_samples} distinct pairs, each query 270 consecutive ones of them "
                       f"({a.pool_samples * WIDTH:,} lookups per cycle)")
    out["lookup"] = (write_pool(os.path.join(a.work, "pool_keys.json"), ({"KEYS": s[i]} for i in range(len(s)))),
                     out["fixed270"][1])
    rng = np.random.default_rng(700)
    sizes, note = mlperf_sizes(a.mlperf_sizes, rng, a.mlperf_queries)
    s, d = draw_pairs(rows, int(sizes.sum()), a.alpha, seed=700)
    at = np.concatenate([[0], np.cumsum(sizes)])
    out["mlperf"] = (write_pool(os.path.join(a.work, "pool_mlperf.json"),
                                ({"sparse": s[at[i]:at[i + 1]], "dense": d[at[i]:at[i + 1]]} for i in range(len(sizes)))),
                     f"MLPerf-like runs: {len(sizes)} distinct queries, {int(sizes.sum()):,} pairs")
    setup["mlperf_mean_pairs"] = float(sizes.mean())
    setup["mlperf_sizes_note"] = (f"{note}, a pool of {len(sizes)} queries (mean {sizes.mean():.1f} pairs) — an "
                                  "approximation of MLPerf's 100-700 pairs per query (its mean is about 270)")
    s, d = draw_pairs(rows, 128 * QUERY, a.alpha, seed=271)
    out["fixed270_ensemble"] = (write_pool(os.path.join(a.work, "pool_queries270.json"),
                                           ({"sparse": s[i * QUERY:(i + 1) * QUERY], "dense": d[i * QUERY:(i + 1) * QUERY]}
                                            for i in range(128))),
                                "270-pair queries through the twin: 128 distinct queries")
    if a.big_concs:
        s, d = draw_pairs(rows, a.big_queries * a.big_pairs, a.alpha, seed=8192)
        b = a.big_pairs
        out["big"] = (write_pool(os.path.join(a.work, "pool_big.json"),
                                 ({"sparse": s[i * b:(i + 1) * b], "dense": d[i * b:(i + 1) * b]}
                                  for i in range(a.big_queries))),
                      f"large requests through the twin: {a.big_queries} distinct requests of {b} pairs")
    with open(os.path.join(a.work, "pools.txt"), "w") as f:
        f.write("\n".join(f"{k}: {v[1]}" for k, v in out.items()) + "\n" + setup["mlperf_sizes_note"] + "\n")
    setup["pools"] = {k: v[1] for k, v in out.items()}
    return out
