"""The GPU cache's geometry and its hit rates: slots per table as the store allocates them, the
stationary hit rate of a cache holding the hottest keys, an LRU cache's rate on an endless
Zipf stream (Che's approximation), and the key pool whose measured rate is the stream's."""
import numpy as np

import zipf_keys

WHOLE_ROOM = 2  # triton_rust_embedding::WHOLE_ROOM: slots per row of a table cached whole


def cache_rows(rows, share, allocation, lookups=None):
    """Cache slots per table, as triton_rust_embedding::cache_rows computes them; `lookups`:
    each table's keys a sample, which "lookups" weighs the tables by (None: one each)."""
    if allocation == "per_table":
        return [int(np.ceil(r * share)) for r in rows]
    weight = [max(int(h), 1) for h in lookups] if allocation == "lookups" and lookups else [1] * len(rows)
    budget, left = int(np.floor(sum(rows) * share)), sum(weight)
    out = [0] * len(rows)
    # water-filling: the tables a level would fill whole first (rows a unit of weight, then order)
    for t in sorted(range(len(rows)), key=lambda t: (rows[t] / weight[t], t)):
        out[t] = min(WHOLE_ROOM * rows[t], budget * weight[t] // max(left, 1))
        budget -= out[t]
        left -= weight[t]
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
