"""DCNv2's cross-layer kernel (examples/triton_kernels.py cross_layer) alone, in many
configurations, on the GPU: each configuration's first layer (x = x0) and later layers timed
with CUDA events (median of --iters) at DCNv2's shapes, its output checked against the first
configuration's, the fastest first. A configuration that does not compile (shared memory,
registers) is listed as failed. Quicker than compiling the whole network per configuration
(bench/gpu/network_profile.py --cross-configs), which is where the chosen one is then checked.

    python3 bench/gpu/cross_sweep.py [--batch 65536] [--configs C1,C2,...] [--best-to FILE]

--best-to writes recsys_perf.py's arguments for the fastest (`--dcnv2-cross triton --cross-config C`).
"""
import argparse
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples"))

# tiles (rows x columns x depth), warps, stages and groups around the default
GRID = ("128x64x64w8s3,128x64x64w8s4,128x64x64w8s2,128x64x64w4s3,128x64x64w4s4,128x64x128w8s2,128x64x32w8s5,"
        "64x64x64w4s3,64x128x64w4s3,128x128x64w8s3,128x128x64w8s4,128x128x32w8s4,256x64x64w8s3,64x256x64w8s3,"
        "128x64x64w8s3g1,128x64x64w8s3g4,128x64x64w8s3g16,128x64x64w8s3e,128x128x64w8s3e")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--width", type=int, default=3456, help="x0's width (DCNv2: 128 + 26 x 128)")
    p.add_argument("--head", type=int, default=128, help="x0's first part (the bottom MLP's output)")
    p.add_argument("--rank", type=int, default=512)
    p.add_argument("--configs", default=GRID)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--best-to", default="")
    a = p.parse_args()

    import torch
    import triton_kernels

    g = torch.Generator(device="cuda").manual_seed(0)
    b, n, d0, r = a.batch, a.width, a.head, a.rank

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).half()

    head, tail, x = rand(b, d0), rand(b, n - d0, scale=0.05), rand(b, n)
    h, w, bias = rand(b, r), rand(n, r, scale=r ** -0.5), rand(n, scale=0.05)

    def timed(fn):
        for _ in range(3):
            fn()
        start = [torch.cuda.Event(enable_timing=True) for _ in range(a.iters)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(a.iters)]
        for s, e in zip(start, end):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in zip(start, end))
        return ms[len(ms) // 2]

    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; cross layer at batch {b}, width {n} "
          f"({d0} + {n - d0}), rank {r}, FP16; median of {a.iters} CUDA-event timings", flush=True)
    rows, want = [], None
    for config in a.configs.split(","):
        os.environ["TRITON_RUST_CROSS"] = config
        try:
            first = triton_kernels.cross_layer(head, tail, None, h, w, bias)
            later = triton_kernels.cross_layer(head, tail, x, h, w, bias)
            torch.cuda.synchronize()
            if want is None:
                want = (first.float(), later.float(), config)
            diff = max(float((first.float() - want[0]).abs().max()), float((later.float() - want[1]).abs().max()))
            t_first = timed(lambda: triton_kernels.cross_layer(head, tail, None, h, w, bias))
            t_later = timed(lambda: triton_kernels.cross_layer(head, tail, x, h, w, bias))
        except Exception as e:  # a configuration that does not compile or launch
            print(f"  {config:22s} failed: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}", flush=True)
            continue
        three = t_first + 2 * t_later
        rows.append((three, config, t_first, t_later, diff))
        print(f"  {config:22s} first {t_first:.3f} ms, later {t_later:.3f} ms, three layers {three:.3f} ms; "
              f"max abs diff vs {want[2]} {diff:.1e}", flush=True)
    if not rows:
        raise SystemExit("no configuration ran")
    rows.sort()
    print("fastest first (three layers = first + 2 later):")
    for three, config, t_first, t_later, diff in rows[:10]:
        print(f"  {config:22s} {three:.3f} ms ({t_first:.3f} + 2 x {t_later:.3f})")
    bad = [r for r in rows if r[4] > 2e-2]
    if bad:
        print("outputs apart from the first configuration's by more than 2e-2: " + ", ".join(r[1] for r in bad))
    best = next(r for r in rows if r[4] <= 2e-2)
    if a.best_to:
        with open(a.best_to, "w") as f:
            f.write(f"--dcnv2-cross triton --cross-config {best[1]}\n")
    print(f"fastest: {best[1]} ({best[0]:.3f} ms for three layers)")


if __name__ == "__main__":
    main()
