"""DCNv2's cross-layer kernel (examples/triton_kernels.py cross_layer) alone, in many
configurations, on the GPU: each configuration's first layer (x = x0) and later layers timed
with CUDA events (median of --iters) at DCNv2's shapes, its output checked against the first
configuration's, the fastest first. A configuration that does not compile (shared memory,
registers) is listed as failed. Quicker than compiling the whole network per configuration
(bench/gpu/network_profile.py --cross-configs), which is where the chosen one is then checked.

    python3 bench/gpu/cross_sweep.py [--batch 65536] [--configs C1,C2,...] [--best-to FILE]
    python3 bench/gpu/cross_sweep.py --fp8 [--batch 16384] [--configs C1,C2,...]

--fp8: the FP8 kernel (cross_layer_fp8, TRITON_RUST_CROSS_FP8) instead, each configuration's
layer (x given, fp16 x' and e4m3 x' written) beside the same layer unfused as the FP8 package
runs it (torch.compile of Fp8Linear's cuBLASLt product, then x0 * y + x and the next layer's
quantization as Inductor fuses them); the outputs compared with the reference in FP32.

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
    p.add_argument("--fp8", action="store_true", help="the FP8 kernel against the unfused FP8 layer")
    a = p.parse_args()
    if a.fp8:
        return fp8_main(a)

    import torch
    import triton_kernels

    g = torch.Generator(device="cuda").manual_seed(0)
    b, n, d0, r = a.batch, a.width, a.head, a.rank

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).half()

    head, tail, x = rand(b, d0), rand(b, n - d0, scale=0.05), rand(b, n)
    h, w, bias = rand(b, r), rand(n, r, scale=r ** -0.5), rand(n, scale=0.05)

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
            t_first = median_ms(lambda: triton_kernels.cross_layer(head, tail, None, h, w, bias), a.iters)
            t_later = median_ms(lambda: triton_kernels.cross_layer(head, tail, x, h, w, bias), a.iters)
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


GRID_FP8 = ("64x128x128w4s3,64x128x128w4s2,64x128x128w4s4,64x128x128w8s3,64x64x128w4s3,64x256x128w8s3,32x128x128w4s3,"
            "64x128x64w4s3,64x128x128w4s3g4,64x128x128w4s3g16,64x128x128w4s3e,128x64x128w8s3,128x128x128w8s3,"
            "128x128x128w8s3g4")


def median_ms(fn, iters):
    """The median of ``iters`` CUDA-event timings of ``fn`` (ms), after 3 calls of warm-up."""
    import torch
    for _ in range(3):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(start, end):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return ms[len(ms) // 2]


def fp8_main(a):
    import torch
    import fp8
    import triton_kernels

    g = torch.Generator(device="cuda").manual_seed(0)
    b, n, d0, r = a.batch, a.width, a.head, a.rank
    configs = GRID_FP8 if a.configs == GRID else a.configs

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).half()

    head, tail, x = rand(b, d0), rand(b, n - d0, scale=0.05), rand(b, n)
    h = rand(b, r)
    u = fp8.Fp8Linear(torch.nn.Linear(r, n).cuda().half(), float(h.abs().max())).cuda()
    inv_out = torch.tensor(fp8.E4M3_MAX / float(x.abs().max() * 2), device="cuda")
    hq = u.quantize(h)
    scales = torch.stack([u.scale_x, u.scale_w, inv_out]).float()

    def unfused(hq):
        y = u.product(hq, torch.float16)
        out = torch.cat([head, tail], dim=1) * y + x
        return out, fp8.quantize(out, inv_out)

    compiled = torch.compile(unfused)
    want16, wantq = triton_kernels.cross_fp8_reference(head, tail, x, hq, u.weight, scales, u.bias, True)
    gbytes = b * n * (2 + 2 + 2 + 1) / 1e9  # x0 and x read, x' in fp16 and e4m3 written
    t_unfused = median_ms(lambda: compiled(hq), a.iters)
    got16, gotq = compiled(hq)
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; FP8 cross layer at batch {b}, width {n} "
          f"({d0} + {n - d0}), rank {r}; median of {a.iters} CUDA-event timings", flush=True)
    print(f"  unfused (torch.compile: cuBLASLt FP8 product, then x0 * y + x and quantize) {t_unfused:.3f} ms; "
          f"|x' - ref| max {float((got16.float() - want16.float()).abs().max()):.1e}", flush=True)
    rows = []
    for config in configs.split(","):
        os.environ["TRITON_RUST_CROSS_FP8"] = config
        try:
            run = lambda: triton_kernels.cross_layer_fp8(head, tail, x, hq, u.weight, scales, u.bias, True)
            got16, gotq = run()
            torch.cuda.synchronize()
            diff = float((got16.float() - want16.float()).abs().max())
            qdiff = float((gotq.float() != wantq.float()).float().mean())
            t = median_ms(run, a.iters)
        except Exception as e:  # a configuration that does not compile or launch
            print(f"  {config:22s} failed: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}", flush=True)
            continue
        rows.append((t, config, diff, qdiff))
        print(f"  {config:22s} {t:.3f} ms ({t_unfused / t:.2f}x unfused, {gbytes / t * 1e3:.0f} GB/s of x0, x, x'); "
              f"|x' - ref| max {diff:.1e}, e4m3 x' unlike ref {100 * qdiff:.3f}%", flush=True)
    if not rows:
        raise SystemExit("no configuration ran")
    rows.sort()
    best = rows[0]
    print(f"fastest: {best[1]} {best[0]:.3f} ms against unfused {t_unfused:.3f} ms ({t_unfused / best[0]:.2f}x)")
    if a.best_to:
        with open(a.best_to, "w") as f:
            f.write(best[1] + "\n")
    return 0


if __name__ == "__main__":
    main()
