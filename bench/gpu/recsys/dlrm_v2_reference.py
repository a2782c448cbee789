"""bench/gpu/dlrm_v2_perf.py's bare PyTorch reference (issue 46), run after the server stopped:
every table in HBM as fp16, F.embedding_bag per table, the network torch.compile'd, timed by CUDA
events; and the compile begun early in a child process (dlrm_v2_perf.py --compile-worker) to
fill Inductor's on-disk caches while the tables are written and the package exported."""
import os
import subprocess
import sys
import time

from .dlrm_v2_model import DIM, HOT, ROW_BYTES, WIDTH
from .fixture import SEED, TABLES

# the command whose --compile-worker compiles the reference in a child process
COMMAND = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dlrm_v2_perf.py")


def reference_network():
    """DCNv2's dense part in fp16 (the weights the package holds), cross layers as written:
    plain PyTorch. Its matrix products' FLOPs per pair: 2 x in x out per linear layer."""
    from .networks import dense_network, linear_flops
    net = dense_network("dcnv2", "fp16", "cuda").m  # HalfDense's fp16 module: fp16 in, fp16 out
    return (net, *linear_flops(net))


def compile_network(mode, batches, label):
    """torch.compile of the reference's network at each batch (static shapes): the compiled network."""
    import torch
    net = reference_network()[0]
    fn = torch.compile(net, mode=mode, dynamic=False)
    t0 = time.time()
    for b in batches:
        with torch.no_grad():
            fn(torch.rand(b, 13, device="cuda", dtype=torch.half),
               torch.randn(b, TABLES, DIM, device="cuda", dtype=torch.half) * 0.05)
        torch.cuda.synchronize()
        print(f"  {label}: the reference network compiled at batch {b} ({mode}), {time.time() - t0:.0f} s so far", flush=True)
    return fn


def start_compile_warmer(a):
    """The reference's compile in a child process, beside the fixture write and the export: it
    fills Inductor's on-disk caches (FX graphs, autotuning), so the compile after the server
    stops finds them. A child, because a compile cannot be stopped inside a process: one past
    --ref-compile-budget-s is killed and the reference compiled in the default mode."""
    cmd = [sys.executable, COMMAND, "--compile-worker", a.ref_compile_mode, a.ref_batches]
    return subprocess.Popen(cmd), time.time()


def finish_compile_warmer(a, warmer):
    """Waits for the child up to --ref-compile-budget-s from its start; (mode, note)."""
    proc, t0 = warmer
    try:
        rc = proc.wait(timeout=max(1.0, a.ref_compile_budget_s - (time.time() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        note = (f"torch.compile(mode=\"{a.ref_compile_mode}\") took more than --ref-compile-budget-s "
                f"{a.ref_compile_budget_s:.0f} s: the reference's network is compiled in the default mode instead.")
        print(f"  NOTE: {note}", flush=True)
        return "default", note
    if rc != 0:
        note = f"the compile in mode \"{a.ref_compile_mode}\" failed (exit {rc}): the default mode instead."
        print(f"  NOTE: {note}", flush=True)
        return "default", note
    print(f"  the reference's compile ({a.ref_compile_mode}) warmed Inductor's caches in {time.time() - t0:.0f} s", flush=True)
    return a.ref_compile_mode, ""


def cuda_seconds(fn, iters):
    """Seconds per call of fn(i), by CUDA events, after three calls to warm up."""
    import torch
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        fn(i)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def reference_phase(a, rows, mode, note, warm_s):
    """The bare PyTorch reference (issue 46): every table in HBM, F.embedding_bag per table
    (sum, full bags), the compiled network; the lookup alone, the network alone, both."""
    import torch
    import torch.nn.functional as F
    import stream_load
    dev = "cuda"
    _, flops, layers = reference_network()
    print(f"  the network: {flops / 1e6:.2f} MFLOP of matrix products per pair (2 x in x out over {layers} linear layers)",
          flush=True)
    t0 = time.time()
    compiled = compile_network(mode, a.ref_batch_list, "after the server")
    compile_s = time.time() - t0
    t0 = time.time()
    # values do not matter for timing; the shapes are the served tables'
    tables = [torch.empty((r, DIM), dtype=torch.half, device=dev).normal_(0.0, 0.05) for r in rows]
    torch.cuda.synchronize()
    print(f"  {len(tables)} fp16 tables in HBM ({sum(rows) * ROW_BYTES / 1e9:.1f} GB) in {time.time() - t0:.0f} s", flush=True)
    gen = torch.Generator(device=dev).manual_seed(SEED + 7)
    out = {}
    with torch.no_grad():
        for b in a.ref_batch_list:
            offsets = [torch.arange(b, device=dev, dtype=torch.int64) * h for h in HOT]
            # four distinct key sets per batch, each table's bags flat (the same Zipf law as served)
            keysets = [[stream_load.torch_spread(stream_load.torch_zipf_ranks(gen, r, a.alpha, b * h, dev), r)
                        for r, h in zip(rows, HOT)] for _ in range(4)]
            dense = torch.rand(b, 13, device=dev, dtype=torch.half)

            def lookup(i):
                ks = keysets[i % len(keysets)]
                return torch.stack([F.embedding_bag(k, w, o, mode="sum") for k, w, o in zip(ks, tables, offsets)], dim=1)

            pooled = lookup(0)
            t_lookup = cuda_seconds(lookup, 30)
            t_net = cuda_seconds(lambda i: compiled(dense, pooled), 30)
            t_both = cuda_seconds(lambda i: compiled(dense, lookup(i)), 30)
            x = {"lookup_s": t_lookup, "lookups_per_s": b * WIDTH / t_lookup,
                 "row_gb_per_s": b * WIDTH * ROW_BYTES / t_lookup / 1e9, "net_s": t_net, "tflops": b * flops / t_net / 1e12,
                 "both_s": t_both, "pairs_per_s": b / t_both}
            out[str(b)] = x
            print(f"  reference batch {b:,} pairs: lookup {t_lookup * 1e3:.3f} ms ({x['lookups_per_s'] / 1e9:.2f} G lookups/s, "
                  f"{x['row_gb_per_s']:.0f} GB/s of rows); network {t_net * 1e3:.3f} ms ({x['tflops']:.0f} TFLOP/s, "
                  f"{100 * x['tflops'] / a.peak_tflops:.0f}% of {a.peak_tflops:.0f}); both {t_both * 1e3:.3f} ms "
                  f"({x['pairs_per_s'] / 1e6:.2f} M pairs/s)", flush=True)
            del keysets, pooled
    del tables
    torch.cuda.empty_cache()
    return {"batches": out, "mode": mode, "compile_seconds": compile_s, "warm_compile_seconds": warm_s, "note": note,
            "flops_per_pair": flops, "linear_layers": layers, "peak_tflops": a.peak_tflops}
