#!/usr/bin/env python3
"""DLRM-v3's network at the benchmark's configuration (5 HSTU layers, 4 heads of 128, width 512),
ours against our PyTorch reference in one run (issue 68, step 2's GPU half):

- the reference, eager: `HstuRanker.forward_padded`, the batch as [B, N, D] under a mask;
- the reference, compiled: the same through `torch.compile`;
- ours: `examples/dlrm_v3/network.py`'s network (the jagged sequence, the attention as our
  Triton kernel on a GPU) exported and compiled by AOTInductor into a package, run through
  `aoti_load_package`.

Each gets the same batch of requests from `examples/dlrm_v3/data.py` at the benchmark's shape
(histories of the inference step's mean, 6,400 items, up to 16,384; 2,048 candidates a request),
ids folded into tables small enough to allocate (the network's speed does not depend on the
tables' sizes; the lookups are the store's, not timed here). Printed: requests/s and ms a batch
of each, the ratios to the compiled reference, ours' largest difference from the eager
reference's scores, and the HSTU layers' useful TFLOP/s. The attention's normaliser is fixed
(docs/dlrm-v3.md).

    python3 bench/gpu/dlrm_v3_network.py [--requests 8] [--dtype bf16] [--reps 5]
    python3 bench/gpu/dlrm_v3_network.py --device cpu --tiny    # the code paths, on the CPU here

Writes its lines to $OUT/dlrm_v3_network.txt when OUT is set.
"""
import argparse
import os
import sys
import tempfile
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples"))
from dlrm_v3 import data as dv3_data  # noqa: E402
from dlrm_v3 import model as dv3  # noqa: E402
from recsys.transcript import Transcript  # noqa: E402
from dlrm_v3 import network as net  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


say = Transcript("dlrm_v3_network.txt").say


def requests(a, cfg):
    """`a.requests` requests at the benchmark's (or the tiny) shape, ids folded into the tables."""
    data = dv3_data.DataConfig.tiny(seconds_per_timestamp=3600) if a.tiny else dv3_data.DataConfig(seconds_per_timestamp=3600)
    batch = dv3_data.generate_batch(data, a.requests, a.seed)
    batch.hist_item_ids = batch.hist_item_ids % cfg.num_item_rows
    batch.cand_item_ids = batch.cand_item_ids % cfg.num_item_rows
    batch.user_ids = batch.user_ids % cfg.num_user_rows
    return batch


def on(batch, device):
    return dv3.Batch(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(batch).items()})


def timed(fn, reps, device):
    fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn()
    sync()
    return (time.perf_counter() - t0) / reps * 1e3, out


def layer_flops(cfg, hist, cand):
    """The HSTU layers' useful FLOPs for requests of these lengths: the projections and the
    output layer on every token, the attention on each allowed (row, key) pair."""
    d, h, dqk, dv = cfg.model_dim, cfg.num_heads, cfg.attn_dim, cfg.linear_dim
    tokens = sum(1 + x + y for x, y in zip(hist, cand))
    pairs = sum((1 + x) * (2 + x) // 2 + y * (2 + x) for x, y in zip(hist, cand))
    per_token = 2 * d * h * (2 * dv + 2 * dqk) + 2 * 3 * h * dv * d
    return cfg.num_layers * (tokens * per_token + pairs * h * 2 * (dqk + dv))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="Config.tiny() and its data: the code paths, quickly")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled reference")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense fp16/bf16 peak (H100/H200 SXM: 989)")
    a = p.parse_args()
    dev, dtype = a.device, DTYPES[a.dtype]
    name = torch.cuda.get_device_name(0) if dev == "cuda" else "CPU"
    say(f"device: {name}; torch {torch.__version__}; {a.dtype}")
    if a.tiny:
        cfg = dv3.Config.tiny(attn_norm_len=145, dtype=dtype)
    else:
        # the tables folded to what can be allocated (half a million items of 512)
        cfg = dv3.Config(num_item_rows=1 << 19, num_user_rows=1 << 16, attn_norm_len=1 + 16384 + 2048, dtype=dtype)
    t0 = time.time()
    ranker = dv3.HstuRanker(cfg).eval().to(dev)
    batch = on(requests(a, cfg), dev)
    hist, cand = batch.hist_lengths.tolist(), batch.cand_lengths.tolist()
    say(f"{a.requests} requests: histories {min(hist)}-{max(hist)} (mean {sum(hist) / len(hist):.0f}), "
        f"candidates {min(cand)}-{max(cand)}; model ready in {time.time() - t0:.1f} s")
    flops = layer_flops(cfg, hist, cand)
    rows = {}
    want = None
    with torch.no_grad():
        try:
            ms, want = timed(lambda: ranker.score_candidates(batch, "padded"), a.reps, dev)
            rows["reference, eager (padded)"] = ms
        except torch.OutOfMemoryError as e:
            say(f"reference, eager (padded): out of memory ({str(e).splitlines()[0][:160]})")
        if not a.no_compile:
            try:
                compiled = torch.compile(ranker.forward_padded)
                t0 = time.time()
                compiled(batch)
                say(f"compiled the reference in {time.time() - t0:.0f} s")
                ms, _ = timed(lambda: compiled(batch), a.reps, dev)
                rows["reference, torch.compile (padded)"] = ms
            except torch.OutOfMemoryError as e:
                say(f"reference, torch.compile (padded): out of memory ({str(e).splitlines()[0][:160]})")
            torch.cuda.empty_cache() if dev == "cuda" else None
        network = net.HstuNetwork(ranker).eval()
        inputs = {k: v.to(dev) for k, v in net.rows_of(ranker, batch).items()}
        args = [inputs[n] for n, _, _ in net.INPUTS]
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.time()
            path = os.path.join(tmp, "network.pt2")
            net.package(network, inputs, path)
            say(f"exported and compiled our package in {time.time() - t0:.0f} s")
            runner = torch._inductor.aoti_load_package(path)
            ms, got = timed(lambda: runner(*args), a.reps, dev)
            rows["ours: the jagged network, AOTInductor package"] = ms
    against = ("compiled" if "reference, torch.compile (padded)" in rows
               else "eager" if "reference, eager (padded)" in rows else "ours")
    base = rows.get(f"reference, {'torch.compile' if against == 'compiled' else 'eager'} (padded)",
                    rows["ours: the jagged network, AOTInductor package"])
    for what, ms in rows.items():
        say(f"  {what:<48} {ms:9.2f} ms a batch  {a.requests / ms * 1e3:10.1f} requests/s  "
            f"{base / ms:5.2f}x the {against} reference  HSTU layers {flops / ms / 1e9:.3g} TFLOP/s useful"
            + (f" ({100 * flops / ms / 1e9 / a.peak_tflops:.0f}% of {a.peak_tflops:g})" if dev == "cuda" else ""))
    if want is not None:
        diff = float((got.float() - want.float()).abs().max())
        say(f"ours against the eager reference: largest difference {diff:.1e} in the predictions ({a.dtype})")


if __name__ == "__main__":
    main()
