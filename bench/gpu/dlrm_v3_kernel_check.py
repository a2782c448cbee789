#!/usr/bin/env python3
"""DLRM-v3's jagged attention kernel (examples/dlrm_v3/kernels.py) on a GPU, in one short call:
equal to the masked form in plain torch on small layouts that cross its blocks (fp32, fp16,
bf16), then timed at the benchmark's shape (4 heads of 128, histories of 6,400 items, the mean
at MLPerf's inference step, and 2,048 candidates a request) against our reference's attention in
eager PyTorch, one request at a time (model.py's attention_one_request, the same math), in the
same call. Useful FLOPs count each allowed (row, key) pair once: 2 x (dqk + dv) a pair and head.

Then the sweep: each of --blocks (kernels.Blocks: rows and keys a program takes, warps, stages,
SiLU exact or one tanh.approx) checked on the small layouts in bf16 and timed at the same shape,
a line each, and the fastest exact one named: the setting TRITON_RUST_HSTU_BLOCKS takes for the
network and the served package.

    python3 bench/gpu/dlrm_v3_kernel_check.py [--requests 8] [--history 6400] [--candidates 2048] [--blocks A;B;...]

Prints every line as it goes and writes them to $OUT/dlrm_v3_kernel_check.txt when OUT is set.
"""
import argparse
import os
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples"))
from dlrm_v3 import kernels  # noqa: E402
from dlrm_v3 import model as dv3  # noqa: E402
from recsys.transcript import Transcript  # noqa: E402



say = Transcript("dlrm_v3_kernel_check.txt").say


def layout(hist, cand, device):
    h = torch.tensor(hist, device=device)
    lengths = 1 + h + torch.tensor(cand, device=device)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long, device=device), torch.cumsum(lengths, 0)])
    return h, offsets


def pairs(hist, cand):
    """Allowed (row, key) pairs: the prefix causal, each candidate the prefix and itself."""
    return sum((1 + h) * (2 + h) // 2 + c * (2 + h) for h, c in zip(hist, cand))


SWEEP = ("32,32,4,3,exact;32,32,4,3,fast;64,32,4,3,fast;64,64,4,3,exact;64,64,4,3,fast;64,64,4,2,fast;"
         "64,64,8,3,fast;128,64,8,3,fast;128,64,8,2,fast;128,32,8,3,fast;64,128,4,2,fast;128,128,8,2,fast")
SMALL = (([0, 3, 40], [3, 1, 5]), ([70, 5], [2, 40]), ([31, 32, 33, 0, 64], [1, 31, 32, 64, 2]),
         ([200, 130], [129, 64]))


def small_error(dtype, dev):
    """The kernel's largest difference from the masked form over SMALL, at the current blocks."""
    worst = 0.0
    for hist, cand in SMALL:
        h, offsets = layout(hist, cand, dev)
        total = int(offsets[-1])
        q, k, v = (torch.randn(total, 4, 128, device=dev).to(dtype) for _ in range(3))
        norm = torch.tensor(float(1 + max(hist) + max(cand)), device=dev)
        got = kernels.hstu_attention(q, k, v, offsets, h, norm, 128 ** -0.5)
        want = kernels.reference(q.float(), k.float(), v.float(), offsets, h, norm, 128 ** -0.5)
        worst = max(worst, float((got.float() - want).abs().max()))
    return worst


def sweep(a, dev, q, k, v, offsets, h, norm, alpha, flops):
    """Each of --blocks checked and timed (see the module's note); the fastest within the bound."""
    best = None
    for cut in a.cuts:
        os.environ[kernels.BLOCKS_ENV] = str(cut)
        try:
            err = small_error(torch.bfloat16, dev)
            ms = timed(lambda: kernels.hstu_attention(q, k, v, offsets, h, norm, alpha), 10)
        except Exception as e:  # a block too large for shared memory, say: that config alone
            say(f"  blocks {cut}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            torch.cuda.synchronize()
            continue
        ok = err <= 2e-2
        tflops = flops / ms / 1e9
        say(f"  blocks {cut}: {ms:.3f} ms, {tflops:.0f} TFLOP/s useful ({100 * tflops / a.peak_tflops:.0f}% of "
            f"{a.peak_tflops:g}); bf16 error {err:.1e} ({'within' if ok else 'PAST'} 2e-2)")
        if ok and (best is None or ms < best[1]):
            best = (cut, ms, tflops)
    os.environ.pop(kernels.BLOCKS_ENV, None)
    if best:
        say(f"fastest blocks within the bound: {best[0]} ({best[1]:.3f} ms, {best[2]:.0f} TFLOP/s, "
            f"{100 * best[2] / a.peak_tflops:.0f}% of {a.peak_tflops:g}): {kernels.BLOCKS_ENV}={best[0]}")
    return best


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--history", type=int, default=6400)
    p.add_argument("--candidates", type=int, default=2048)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense fp16/bf16 peak (H100/H200 SXM: 989)")
    p.add_argument("--blocks", default=SWEEP, help="the blocks swept, ';' between them (kernels.Blocks.parse's form)")
    a = p.parse_args()
    try:  # every setting read before the GPU's work: a malformed one stops the run at once
        a.cuts = [kernels.Blocks.parse(x) for x in a.blocks.split(";") if x.strip()]
    except ValueError as e:
        p.error(str(e))
    dev = "cuda"
    say(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    torch.manual_seed(0)
    t0 = time.time()
    for dtype, bound in ((torch.float32, 2e-3), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        worst = small_error(dtype, dev)
        say(f"exact {str(dtype).removeprefix('torch.')}: largest difference from the masked form {worst:.1e} "
            f"({'within' if worst <= bound else 'PAST'} {bound:g}; fp32 runs on TF32 tensor cores)")
    say(f"  ({time.time() - t0:.1f} s, Triton's compiles included)")
    n, hl, cl = a.requests, a.history, a.candidates
    hist, cand = [hl] * n, [cl] * n
    h, offsets = layout(hist, cand, dev)
    total = int(offsets[-1])
    q, k, v = (torch.randn(total, 4, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
    norm = torch.tensor(float(1 + hl + cl), device=dev)
    alpha = 128 ** -0.5
    ms = timed(lambda: kernels.hstu_attention(q, k, v, offsets, h, norm, alpha), 10)
    flops = pairs(hist, cand) * 4 * 2 * (128 + 128)
    say(f"kernel, bf16, {n} requests of {hl} history items and {cl} candidates ({total:,} rows, 4 heads of 128), "
        f"blocks {kernels.blocks()}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s useful "
        f"({100 * flops / ms / 1e9 / a.peak_tflops:.0f}% of {a.peak_tflops:g})")
    say(f"the blocks swept ({kernels.BLOCKS_ENV}: BM,BN,WARPS,STAGES,SiLU), the same shape:")
    sweep(a, dev, q, k, v, offsets, h, norm, alpha, flops)

    def eager():
        outs = []
        for b in range(n):
            s, e = int(offsets[b]), int(offsets[b + 1])
            outs.append(dv3.attention_one_request(q[s:e], k[s:e], v[s:e], 1 + hl, int(norm), alpha))
        return torch.cat(outs)

    ref_ms = timed(eager, 3)
    diff = float((kernels.hstu_attention(q, k, v, offsets, h, norm, alpha).float().flatten(1)
                  - eager().float()).abs().max())
    say(f"eager PyTorch (our reference's attention, a request at a time), bf16: {ref_ms:.3f} ms; "
        f"kernel {ref_ms / ms:.2f}x its speed; largest difference {diff:.1e}")
    # the same kernel launched from Inductor's code (the served package is Inductor's): on the
    # same tensors, and on q, k, v split from one projection as the network makes them
    op = torch.compile(lambda q, k, v: kernels.hstu_attention(q, k, v, offsets, h, norm, alpha))
    ms_c = timed(lambda: op(q, k, v), 10)
    say(f"the kernel through torch.compile, same tensors: {ms_c:.3f} ms ({ms / ms_c:.2f}x the direct launch)")
    qkv = torch.randn(total, 4 * 4 * 128, device=dev, dtype=torch.bfloat16)

    def split(x):
        _, vv, qq, kk = x.split([512, 512, 512, 512], -1)
        return qq.unflatten(-1, (4, 128)), kk.unflatten(-1, (4, 128)), vv.unflatten(-1, (4, 128))

    ms_s = timed(lambda: kernels.hstu_attention(*split(qkv), offsets, h, norm, alpha), 10)
    split_op = torch.compile(lambda x: kernels.hstu_attention(*split(x), offsets, h, norm, alpha))
    ms_sc = timed(lambda: split_op(qkv), 10)
    say(f"q, k, v split from one projection: direct {ms_s:.3f} ms, through torch.compile {ms_sc:.3f} ms")
    # static shapes: whether what Inductor cannot prove under dynamic shapes is what costs
    static_op = torch.compile(lambda x: kernels.hstu_attention(*split(x), offsets, h, norm, alpha), dynamic=False)
    say(f"  through torch.compile(dynamic=False): {timed(lambda: static_op(qkv), 10):.3f} ms")
    # how Inductor launches it: the kernel's compile options and argument hints in its code
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    _, codes = run_and_get_code(split_op, qkv)  # compiled again after the reset, its code kept
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "inductor_code.py"), "w") as f:
            f.write("\n\n# ----\n\n".join(codes))
    for line in "\n".join(codes).splitlines():
        if any(w in line for w in ("triton_meta", "num_stages", "num_warps", "'configs'", "user_autotune", "_hstu_attention_kernel")):
            say(f"  inductor: {line.strip()[:400]}")
    say(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
