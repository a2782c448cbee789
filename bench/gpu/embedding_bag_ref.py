#!/usr/bin/env python3
"""The bare PyTorch reference for the pooled lookup alone (issue 46), run by `run.sh pooled-bench`
right after crates/embedding/examples/pooled_lookup_bench.rs in the same call: MLPerf DLRM-v2's 26 tables of dim 128
at --scale of its rows as fp16 tensors in HBM, each sample's 214 keys (every bag full) pooled by
`torch.nn.functional.embedding_bag` (sum) table by table, then stacked to [batch, 26, 128] as a
network would read them; keys already on the GPU, uniform over each table or Zipf (--alpha, ranks
spread over the rows). Timed with CUDA events, in lookups/s and GB/s of rows, at the batches the
kernel bench used."""
import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROWS = [40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956, 405_282, 10,
        2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590_152, 12_973, 108, 36]
HOTNESS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
DIM = 128


def zipf_keys(rng, n, alpha, count):
    """`count` keys over 0..n: Zipf ranks (rank 0 most frequent), spread by a multiplication that
    is a bijection of 0..n when n is odd, else close to one."""
    if n == 1:
        return np.zeros(count, np.int64)
    cdf = np.cumsum(1.0 / np.arange(1, n + 1, dtype=np.float64) ** alpha)
    ranks = np.searchsorted(cdf / cdf[-1], rng.random(count))
    return (ranks.astype(np.int64) * 2_654_435_761) % n


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--batches", default="1024,4096,16384")
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--iters", type=int, default=30)
    a, _ = p.parse_known_args()
    dev = torch.device("cuda")
    rows = [max(1, int(round(r * a.scale))) for r in ROWS]
    tables = [torch.empty((n, DIM), dtype=torch.float16, device=dev).normal_(0, 0.05) for n in rows]
    print(f"reference: 26 fp16 tables in HBM ({sum(rows) * DIM * 2 / 1e9:.1f} GB), torch {torch.__version__}, "
          f"F.embedding_bag(mode='sum') per table then stacked", flush=True)
    rng = np.random.default_rng(46)
    for batch in [int(b) for b in a.batches.split(",")]:
        for skew in ("uniform", "zipf"):
            keys, offsets = [], []
            for n, h in zip(rows, HOTNESS):
                k = rng.integers(0, n, batch * h) if skew == "uniform" else zipf_keys(rng, n, a.alpha, batch * h)
                keys.append(torch.from_numpy(k).to(dev))
                offsets.append(torch.arange(0, batch * h, h, device=dev))

            def step():
                return torch.stack([F.embedding_bag(k, t, o, mode="sum") for k, t, o in zip(keys, tables, offsets)], 1)

            step()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(a.iters):
                step()
            end.record()
            end.synchronize()
            secs = start.elapsed_time(end) / 1e3 / a.iters
            lookups = batch * sum(HOTNESS) / secs
            print(f"reference batch {batch:6} ({skew:7}): {secs * 1e6:8.1f} us a batch, {lookups / 1e9:6.2f} G lookups/s, "
                  f"{lookups * DIM * 2 / 1e9:7.1f} GB/s of rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
