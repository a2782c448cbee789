#!/usr/bin/env python3
"""Realistic recommender requests for perf_analyzer (issue 8): per table, keys drawn from a
Zipf law of exponent --alpha over that table's rows, its hot keys spread over the key space
(rank r is key (r * P) mod rows, P a prime coprime with rows, so the hottest keys are not
simply the smallest ids), a different key set in every request.

Writes a perf_analyzer `--input-data` JSON file with one step per distinct request, each a
whole batch: `sparse` int64 [batch, 26] and `dense` float32 [batch, 13], base64-encoded.

Why whole batches per step: perf_analyzer builds a batch of -b rows from consecutive steps,
and with shared memory it registers one region per step holding -b rows, so steps of one
row each need steps x batch x row-size bytes of shared memory (35 GB for 8 distinct
requests of 4096). The benchmark therefore serves a non-batching copy of the ensemble
(max_batch_size 0, dims [-1, 26] and [-1, 13]) and runs perf_analyzer with -b 1 and
`--shape`; inferences/s = requests/s x batch (docs/performance.md says so where it reports).

    python3 bench/gpu/zipf_keys.py --rows 40000000,39060,... --batch 4096 --requests 16 \\
        --alpha 1.2 --out /tmp/keys_b4096_a1.2.json
"""
import argparse
import base64
import functools
import json
import math

import numpy as np

# MLPerf DLRMv2 (Criteo 1TB) table sizes, as examples/make_tables.py and criteo_fixture.rs
CRITEO_1TB_ROWS = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
]
PRIME = 2_147_483_647  # 2^31 - 1


HEAD = 1 << 20  # ranks sampled from the exact discrete law; the tail by inversion


@functools.lru_cache(maxsize=None)
def _law(n_rows, alpha):
    """(cumulative weights of the first HEAD ranks, their mass, the tail's mass)."""
    h = min(n_rows, HEAD)
    cdf = np.cumsum(np.arange(1, h + 1, dtype=np.float64) ** -alpha)
    tail = 0.0
    if n_rows > h:
        # sum of k^-alpha over k = h+1..n by the midpoint integral: exact to ~1e-12 relative here
        lo, hi = h + 0.5, n_rows + 0.5
        tail = math.log(hi / lo) if abs(alpha - 1.0) < 1e-12 else (hi ** (1 - alpha) - lo ** (1 - alpha)) / (1 - alpha)
    return cdf, float(cdf[-1]), tail


def zipf_ranks(rng, n_rows, alpha, count):
    """0-based ranks in [0, n_rows) with P(rank r) proportional to (r+1)^-alpha: the first
    2^20 ranks from the exact discrete law, the rest (tables of 40 M rows) by inverting the
    continuous law on [2^20 + 0.5, n + 0.5) and rounding."""
    cdf, head, tail = _law(n_rows, alpha)
    u = rng.random(count) * (head + tail)
    ranks = np.empty(count, np.int64)
    in_head = u < head
    ranks[in_head] = np.minimum(np.searchsorted(cdf, u[in_head], side="right"), len(cdf) - 1)
    if tail > 0:
        v = u[~in_head] - head
        lo = len(cdf) + 0.5
        if abs(alpha - 1.0) < 1e-12:
            x = lo * np.exp(v)
        else:
            x = (lo ** (1 - alpha) + v * (1 - alpha)) ** (1 / (1 - alpha))
        ranks[~in_head] = np.clip(np.floor(x + 0.5).astype(np.int64) - 1, len(cdf), n_rows - 1)
    return ranks


def spread(ranks, n_rows):
    """Rank -> key: a bijection of [0, n_rows) that scatters the hot ranks."""
    p = PRIME % n_rows if n_rows > 1 else 0
    while n_rows > 1 and math.gcd(p, n_rows) != 1:
        p += 1
    return (ranks * p) % n_rows if n_rows > 1 else ranks


def make_requests(rows, batch, requests, alpha, seed):
    """`requests` distinct requests of `batch` rows: [(sparse int64 [batch, tables], dense float32
    [batch, 13])], each table's keys drawn for the whole pool at once."""
    rng = np.random.default_rng(seed)
    sparse = np.empty((requests, batch, len(rows)), np.int64)
    for t, n in enumerate(rows):
        sparse[:, :, t] = spread(zipf_ranks(rng, n, alpha, requests * batch), n).reshape(requests, batch)
    dense = rng.random((requests, batch, 13), dtype=np.float32)
    return [(sparse[i], dense[i]) for i in range(requests)]


def b64(a):
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(map(str, CRITEO_1TB_ROWS)), help="rows per table (default: Criteo 1TB)")
    p.add_argument("--scale", type=float, default=1.0, help="scale of --rows (as criteo_fixture --scale)")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--requests", type=int, default=16, help="distinct requests (perf_analyzer cycles through them)")
    p.add_argument("--alpha", type=float, default=1.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rows = [max(1, int(int(r) * a.scale)) for r in a.rows.split(",")]
    reqs = make_requests(rows, a.batch, a.requests, a.alpha, a.seed)
    data = [{"sparse": {"b64": b64(s), "shape": list(s.shape)}, "dense": {"b64": b64(d), "shape": list(d.shape)}}
            for s, d in reqs]
    with open(a.out, "w") as f:
        json.dump({"data": data}, f)
    keys = np.concatenate([s.reshape(-1) for s, _ in reqs])
    distinct = sum(len(np.unique(s[:, t])) for s, _ in reqs for t in range(len(rows)))
    print(f"{a.requests} requests of {a.batch} rows x {len(rows)} tables, alpha {a.alpha}: {keys.size} keys, "
          f"{distinct / keys.size:.1%} distinct within a request's table; wrote {a.out}")


if __name__ == "__main__":
    main()
