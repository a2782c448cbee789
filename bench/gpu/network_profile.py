#!/usr/bin/env python3
"""Where a recommender's dense network spends its time on this GPU, compiled by Inductor.

For each model (dlrm, dcnv2, wide_deep; FP16 behind FP32 inputs, as recsys_perf.py exports
dense.pt2), at its batch: the network in torch eager and compiled by Inductor (torch.compile,
the code generator AOTInductor packages use), each timed with CUDA events (median of 20 runs,
inputs already on the GPU), its floating-point work counted (torch.utils.flop_counter) so the
achieved TFLOP/s stand beside the time, and the compiled run's kernels from torch.profiler,
the heaviest first. DLRM's interaction forms (`--dlrm-forms`: `cat`, `split`, `triton`) and DCNv2's cross-layer forms
(`--dcnv2-forms`: `torch`, `triton`) are each measured.

    python3 bench/gpu/network_profile.py [--models dlrm,dcnv2,wide_deep] [--batch 65536]
        [--inductor max_autotune=true]

Prints everything; writes nothing.
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import torch  # noqa: E402

BATCHES = {"dlrm": 65536, "dcnv2": 65536, "wide_deep": 131072}


def timed(fn, args, iters=20):
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*args)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def flops(module, args):
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        module(*args)
    return counter.get_total_flops()


def kernels(fn, args, top, say=print, reps=5):
    """The `top` kernels of `reps` runs of fn(*args) by GPU time, a run's share each, via `say`."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn(*args)
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            t = getattr(ev, "device_time", None) or getattr(ev, "cuda_time", 0)
            n, total = rows.get(ev.name, (0, 0.0))
            rows[ev.name] = (n + 1, total + t)
    total = sum(t for _, t in rows.values()) or 1.0
    say(f"    kernels of one run: {total / reps / 1e3:.3f} ms in all (sum of kernel times)")
    for name, (n, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        say(f"    {t / reps / 1e3:8.3f} ms {100 * t / total:5.1f}%  x{n // reps:<3d} {name[:110]}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="dlrm,dcnv2,wide_deep")
    p.add_argument("--batch", type=int, default=0, help="one batch for every model (default: each model's)")
    p.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                   help="an Inductor setting for the compiled runs (e.g. max_autotune=true); repeatable")
    p.add_argument("--dlrm-forms", default="cat,split,triton", help="DLRM's interaction forms measured")
    p.add_argument("--dcnv2-forms", default="torch,triton", help="DCNv2's cross-layer forms measured")
    p.add_argument("--cross-configs", default="",
                   help="DCNv2's cross-layer kernel measured in each of these configurations (examples/triton_kernels.py "
                        "cross_config, e.g. 128x64x64w8s3,128x128x64w8s3); default: its default")
    p.add_argument("--best-cross-to", default="",
                   help="write recsys_perf.py's DCNv2 arguments for the fastest compiled cross-layer form measured "
                        "(`--dcnv2-cross torch`, or `--dcnv2-cross triton --cross-config C`) into this file, so that "
                        "one device call can measure the forms and serve the best")
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    import aoti_export
    import triton_kernels
    from recsys.networks import dense_network

    options = aoti_export.parse_inductor_configs(a.inductor)
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; Inductor settings {options or 'default'}",
          flush=True)
    compiled_ms = {}  # DCNv2's cross-layer form -> its compiled network's time
    firsts = {}  # model -> (its first form, that form's eager output)
    works = {}  # model -> its first form's floating-point work a run
    for name in a.models.split(","):
        forms = {"dlrm": a.dlrm_forms.split(","), "dcnv2": a.dcnv2_forms.split(",")}.get(name, [None])
        if name == "dcnv2" and "triton" in forms and a.cross_configs:
            # one run per kernel configuration (read when the module is compiled)
            forms = [f for f in forms if f != "triton"] + [f"triton {c}" for c in a.cross_configs.split(",")]
        batch = a.batch or BATCHES[name]
        for form in forms:
            if form and form.startswith("triton "):
                os.environ["TRITON_RUST_CROSS"] = form.split()[1]
            net = (dense_network(name, "fp16", "cuda", interaction=form) if name == "dlrm" else
                   dense_network(name, "fp16", "cuda", cross=form.split()[0]) if name == "dcnv2" else
                   dense_network(name, "fp16", "cuda"))
            g = torch.Generator(device="cuda").manual_seed(0)
            dim = 65 if name == "wide_deep" else 128
            args = (torch.randn(batch, 13, device="cuda", generator=g),
                    torch.randn(batch, 26, dim, device="cuda", generator=g).half())
            label = f"{name}{' ' + form if form else ''} batch {batch}"
            try:
                with torch.inference_mode():
                    # the model's first form counted (the floating-point work of every form; the
                    # counter does not see inside our Triton kernels)
                    if name not in works:
                        works[name] = flops(net, args)
                    work = works[name]
                    eager = timed(net, args)
                    t0 = time.time()
                    compiled = torch.compile(net, options=options or None, dynamic=False)
                    got = compiled(*args)
                    compile_s = time.time() - t0
                    fast = timed(compiled, args)
                    want = net(*args)
                    diff = float((got - want).abs().max())
                    # each form against the model's first form (the same weights): DCNv2's kernel
                    # against cuBLAS and torch's elementwise passes
                    first = firsts.setdefault(name, (form, want))
                    versus = "" if first[0] == form else \
                        f"; vs the {first[0]} form {float((got - first[1]).abs().max()):.1e}"
                    print(f"{label}: {work / 1e9:.1f} GFLOP a run; eager {eager:.3f} ms ({work / eager / 1e9:.0f} TFLOP/s, "
                          f"{batch / eager / 1e3:.2f} M/s); Inductor {fast:.3f} ms ({work / fast / 1e9:.0f} TFLOP/s, "
                          f"{batch / fast / 1e3:.2f} M/s; compiled in {compile_s:.0f} s; max abs diff vs eager {diff:.1e}"
                          f"{versus})", flush=True)
                    kernels(compiled, args, a.top)
            except Exception as e:  # a configuration that does not compile (shared memory, registers)
                print(f"{label}: failed: {str(e).splitlines()[0][:300] if str(e) else type(e).__name__}", flush=True)
                torch._dynamo.reset()
                continue
            if name == "dcnv2" and form:
                compiled_ms[form] = fast
            del net, compiled
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    if a.best_cross_to and compiled_ms:
        best = min(compiled_ms, key=compiled_ms.get)
        kind, _, config = best.partition(" ")
        if kind == "triton" and not config:
            config = triton_kernels.cross_config_text()
        words = f"--dcnv2-cross {kind}" + (f" --cross-config {config}" if kind == "triton" else "")
        with open(a.best_cross_to, "w") as f:
            f.write(words + "\n")
        print(f"fastest DCNv2 cross-layer form: {best} ({compiled_ms[best]:.3f} ms); recsys_perf.py arguments: {words}",
              flush=True)


if __name__ == "__main__":
    main()
