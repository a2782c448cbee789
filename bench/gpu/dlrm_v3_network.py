#!/usr/bin/env python3
"""DLRM-v3's network at the benchmark's configuration (5 HSTU layers, 4 heads of 128, width 512),
ours against our PyTorch reference in one run (issue 68, step 2's GPU half):

- the reference, eager: `HstuRanker.forward_padded`, the batch as [B, N, D] under a mask;
- the reference, compiled: the same through `torch.compile`;
- ours: `examples/dlrm_v3/network.py`'s network (the jagged sequence, the attention as our
  Triton kernel on a GPU), eager and through `torch.compile` (Inductor: the compiler that makes
  the served package from the same module). On the CPU the package itself is run too
  (`aoti_load_package`); on the GPU machine Python's package loader segfaults (DESIGN.md), so the
  package's own speed there is the server's to measure.

Each row is printed as soon as it is measured.

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
from dlrm_v3 import kernels  # noqa: E402
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



def timed(fn, reps, device):
    fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn()
    sync()
    return (time.perf_counter() - t0) / reps * 1e3, out


def attention_flops(cfg, hist, cand):
    """The attention's useful FLOPs in the HSTU layers for requests of these lengths: each
    allowed (row, key) pair's scores and weighted values."""
    pairs = sum((1 + x) * (2 + x) // 2 + y * (2 + x) for x, y in zip(hist, cand))
    return cfg.num_layers * pairs * cfg.num_heads * 2 * (cfg.attn_dim + cfg.linear_dim)


def layer_flops(cfg, hist, cand):
    """The HSTU layers' useful FLOPs for requests of these lengths: the projections and the
    output layer on every token, and the attention (attention_flops)."""
    d, h, dqk, dv = cfg.model_dim, cfg.num_heads, cfg.attn_dim, cfg.linear_dim
    tokens = sum(1 + x + y for x, y in zip(hist, cand))
    per_token = 2 * d * h * (2 * dv + 2 * dqk) + 2 * 3 * h * dv * d
    return cfg.num_layers * tokens * per_token + attention_flops(cfg, hist, cand)


def parts(network, args, flops, attn_flops, a, dev, attempt):
    """Where the compiled network's time goes: its three parts (network.py: the tokens with their
    MLPs, the HSTU layers, the score head) each compiled and timed alone on the inputs the part
    before gives it, and within the layers the attention kernel's five calls alone. The layers'
    useful TFLOP/s here are over their own time, the figure the issue's 40% target names."""
    def one(what, fn):
        got = attempt(what, lambda: timed(fn, a.reps, dev))
        return got[0] if got else float("nan")

    tokens, layers, score = (torch.compile(f) for f in (network.tokens, network.layers, network.score))
    x, offsets, norm, cand_at, cand_req = tokens(*args)
    hist_lengths, cand_item_rows, cand_category_rows, query_times = args[1], args[7], args[8], args[9]
    y = layers(x, offsets, hist_lengths, norm)
    score(y, cand_at, cand_req, query_times, cand_item_rows, cand_category_rows)
    ms = {"tokens": one("tokens", lambda: tokens(*args)),
          "layers": one("layers", lambda: layers(x, offsets, hist_lengths, norm)),
          "score": one("score", lambda: score(y, cand_at, cand_req, query_times, cand_item_rows,
                                              cand_category_rows))}
    # the attention's own inputs, layer by layer (eager), then its five calls alone
    qkv, h = [], x
    for layer in network.ranker.layers:
        u, q, k, v = layer.project(h)
        attn = kernels.hstu_attention(q, k, v, offsets, hist_lengths, norm, layer.alpha)
        qkv.append((q, k, v, layer.alpha))
        h = layer.finish(h, u, attn.flatten(1))
    ms["attention"] = one("attention", lambda: [kernels.hstu_attention(q, k, v, offsets, hist_lengths, norm, al)
                                                for q, k, v, al in qkv])
    del qkv
    peak = lambda f, t: f" ({100 * f / t / 1e9 / a.peak_tflops:.1f}% of {a.peak_tflops:g})" if dev == "cuda" else ""
    whole = ms["tokens"] + ms["layers"] + ms["score"]
    say(f"  where the compiled network's time goes (each part compiled and timed alone, {whole:.2f} ms in all):")
    say(f"    tokens and their MLPs        {ms['tokens']:8.2f} ms  {100 * ms['tokens'] / whole:4.1f}%")
    say(f"    the HSTU layers              {ms['layers']:8.2f} ms  {100 * ms['layers'] / whole:4.1f}%  "
        f"{flops / ms['layers'] / 1e9:.3g} TFLOP/s useful{peak(flops, ms['layers'])}")
    say(f"      of which the attention     {ms['attention']:8.2f} ms  (its 5 calls alone, eager: "
        f"{attn_flops / ms['attention'] / 1e9:.3g} TFLOP/s useful{peak(attn_flops, ms['attention'])})")
    say(f"    the score head               {ms['score']:8.2f} ms  {100 * ms['score'] / whole:4.1f}%")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="Config.tiny() and its data: the code paths, quickly")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled reference")
    p.add_argument("--no-reference", action="store_true", help="time ours alone (no padded reference)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="on a GPU, the N heaviest kernels of ours eager and compiled (torch.profiler)")
    p.add_argument("--no-parts", action="store_true", help="skip the network's parts timed alone")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense fp16/bf16 peak (H100/H200 SXM: 989)")
    a = p.parse_args()
    dev, dtype = a.device, DTYPES[a.dtype]
    name = torch.cuda.get_device_name(0) if dev == "cuda" else "CPU"
    say(f"device: {name}; torch {torch.__version__}; {a.dtype}; attention blocks {kernels.blocks()} "
        f"({kernels.BLOCKS_ENV})")
    if a.tiny:
        cfg = dv3.Config.tiny(attn_norm_len=145, dtype=dtype)
    else:
        # the tables folded to what can be allocated (half a million items of 512)
        cfg = dv3.Config(num_item_rows=1 << 19, num_user_rows=1 << 16, attn_norm_len=1 + 16384 + 2048, dtype=dtype)
    t0 = time.time()
    ranker = dv3.HstuRanker(cfg).eval().to(dev)
    batch = requests(a, cfg).to(dev)
    hist, cand = batch.hist_lengths.tolist(), batch.cand_lengths.tolist()
    say(f"{a.requests} requests: histories {min(hist)}-{max(hist)} (mean {sum(hist) / len(hist):.0f}), "
        f"candidates {min(cand)}-{max(cand)}; model ready in {time.time() - t0:.1f} s")
    flops = layer_flops(cfg, hist, cand)
    want = None
    base = {}

    def row(what, ms):
        """Prints a row now; the first reference measured is the ratios' base."""
        if what.startswith("reference") and not base:
            base["what"], base["ms"] = what, ms
        ratio = f"{base['ms'] / ms:5.2f}x {base['what']}" if base else ""
        say(f"  {what:<46} {ms:9.2f} ms a batch  {a.requests / ms * 1e3:10.1f} requests/s  "
            f"HSTU layers {flops / ms / 1e9:.3g} TFLOP/s useful"
            + (f" ({100 * flops / ms / 1e9 / a.peak_tflops:.0f}% of {a.peak_tflops:g})" if dev == "cuda" else "")
            + (f"  {ratio}" if ratio else ""))

    def attempt(what, fn):
        try:
            return fn()
        except torch.OutOfMemoryError as e:
            say(f"  {what}: out of memory ({str(e).splitlines()[0][:160]})")
            if dev == "cuda":
                torch.cuda.empty_cache()
            return None

    with torch.no_grad():
        if not a.no_compile and not a.no_reference:
            # the compiled reference first: it is the base of the ratios
            compiled = torch.compile(ranker.forward_padded)
            t0 = time.time()
            if attempt("reference, torch.compile (padded)", lambda: compiled(batch)) is not None:
                say(f"compiled the reference in {time.time() - t0:.0f} s")
                got = attempt("reference, torch.compile (padded)", lambda: timed(lambda: compiled(batch), a.reps, dev))
                if got:
                    row("reference, torch.compile (padded)", got[0])
            del compiled
        got = None if a.no_reference else attempt("reference, eager (padded)", lambda: timed(lambda: ranker.score_candidates(batch, "padded"), a.reps, dev))
        if got:
            row("reference, eager (padded)", got[0])
            want = got[1]
        network = net.HstuNetwork(ranker).eval()
        inputs = {k: v.to(dev) for k, v in net.rows_of(ranker, batch).items()}
        args = [inputs[n] for n, _, _ in net.INPUTS]
        outs = {}
        got = attempt("ours, eager", lambda: timed(lambda: network(*args), a.reps, dev))
        if got:
            row("ours: the jagged network, eager", got[0])
            outs["eager"] = got[1]
        ours = torch.compile(network)
        t0 = time.time()
        if attempt("ours, torch.compile", lambda: ours(*args)) is not None:
            say(f"compiled ours in {time.time() - t0:.0f} s")
            got = attempt("ours, torch.compile", lambda: timed(lambda: ours(*args), a.reps, dev))
            if got:
                row("ours: the jagged network, torch.compile", got[0])
                outs["torch.compile"] = got[1]
        if not a.no_parts:
            parts(network, args, flops, attention_flops(cfg, hist, cand), a, dev, attempt)
        if a.profile and dev == "cuda":
            from network_profile import kernels as heaviest
            for what, fn in (("eager", network), ("torch.compile", ours)):
                say(f"  ours, {what}: where the GPU's time goes")
                heaviest(fn, args, a.profile, say=say, reps=2)
        if dev == "cpu":
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.time()
                path = os.path.join(tmp, "network.pt2")
                net.package(network, inputs, path)
                say(f"exported and compiled our package in {time.time() - t0:.0f} s")
                runner = torch._inductor.aoti_load_package(path)
                ms, outs["package"] = timed(lambda: runner(*args), a.reps, dev)
                row("ours: the jagged network, AOTInductor package", ms)
    if want is not None:
        for what, got in outs.items():
            diff = float((got.float() - want.float()).abs().max())
            say(f"ours ({what}) against the eager reference: largest difference {diff:.1e} in the predictions ({a.dtype})")


if __name__ == "__main__":
    main()
