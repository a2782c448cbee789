#!/usr/bin/env python3
"""Where the recommenders' GPU time goes, in bare torch (no server): the dense networks as the
server runs them (TorchScript, fp16 behind fp32 inputs), with and without padding the first
layers' widths to a multiple of 8 (`recommenders.padding`), and the ceiling's gather from one
table of every row (more than 2^31 elements). Prints the time per batch and the CUDA kernels
that take it (torch.profiler).

    python3 bench/gpu/recsys_profile.py [--models dlrm,dcnv2,wide_deep] [--batches 4096,65536]
        [--gather-rows 163000000]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.insert(0, HERE)
import recommenders  # noqa: E402
from all_models import HalfDense  # noqa: E402

TABLES = recommenders.NUM_TABLES


def timed(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def kernels(fn, top=8):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 3 / 1e3) for e in prof.key_averages()]
    rows.sort(key=lambda r: -r[1])
    total = sum(t for _, t in rows)
    return total, rows[:top]


def network(name, align, dev, interaction="cat"):
    options = {"interaction": interaction} if name == "dlrm" else {}
    model = recommenders.make(name, [1] * TABLES, align=align, **options)
    return torch.jit.script(HalfDense(recommenders.DensePart(model)).to(dev).eval())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="dlrm,dcnv2,wide_deep")
    p.add_argument("--batches", default="4096,65536")
    p.add_argument("--aligns", default="1,8", help="recommenders.padding's align values to compare")
    p.add_argument("--fusers", default="on", help="TorchScript's tensor-expression fuser: on, off or on,off")
    p.add_argument("--dlrm-interactions", default="cat,split", help="DLRM's interaction forms to compare (recommenders.DLRM)")
    p.add_argument("--top", type=int, default=8, help="kernels listed per network and batch")
    p.add_argument("--gather-rows", type=int, default=163_000_000, help="rows of the ceiling's one table (0: skip)")
    a = p.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(0), torch.__version__, flush=True)
    batches = [int(b) for b in a.batches.split(",")]
    with torch.no_grad():
        for name in a.models.split(","):
            dim = 65 if name == "wide_deep" else 128
            forms = a.dlrm_interactions.split(",") if name == "dlrm" else ["-"]
            for align, fuser, form in [(int(al), f, i) for al in a.aligns.split(",") for f in a.fusers.split(",") for i in forms]:
                torch._C._jit_set_texpr_fuser_enabled(fuser == "on")
                net = network(name, align, dev, form if form != "-" else "cat")
                for b in batches:
                    dense = torch.randn(b, 13, device=dev)
                    emb32 = torch.randn(b, TABLES, dim, device=dev) * 0.1
                    emb16 = emb32.half()
                    t32 = timed(lambda: net(dense, emb32))
                    t16 = timed(lambda: net(dense, emb16))
                    total, top = kernels(lambda: net(dense, emb16), a.top)
                    print(f"{name:9s} align {align} fuser {fuser:3s} {'interaction ' + form + ' ' if form != '-' else ''}batch {b:6d}: fp32 rows in {t32:7.3f} ms ({b / t32 / 1e3:6.2f} M/s), "
                          f"fp16 rows in {t16:7.3f} ms ({b / t16 / 1e3:6.2f} M/s); kernels {total:.3f} ms", flush=True)
                    for k, t in top:
                        print(f"      {t:7.3f} ms  {k[:110]}")
                del net
        if a.gather_rows:
            big = torch.empty((a.gather_rows, 128), dtype=torch.half, device=dev)
            big.normal_(0.0, 0.05)
            for b in batches:
                idx = torch.randint(0, a.gather_rows, (b * TABLES,), device=dev)
                t_is = timed(lambda: big.index_select(0, idx))
                t_emb = timed(lambda: torch.nn.functional.embedding(idx, big))
                as64 = big.view(torch.int64)  # 32 words a row
                t_w = timed(lambda: as64.index_select(0, idx))
                gb = b * TABLES * 128 * 2 / 1e9
                print(f"gather {b * TABLES:8d} rows of {a.gather_rows} x 128 fp16: index_select {t_is:.3f} ms "
                      f"({gb / t_is * 1e3:.0f} GB/s), embedding {t_emb:.3f} ms, as int64 words {t_w:.3f} ms", flush=True)
                total, top = kernels(lambda: big.index_select(0, idx), top=3)
                for k, t in top:
                    print(f"      {t:7.3f} ms  {k[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
