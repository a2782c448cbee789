#!/usr/bin/env python3
"""DLRM-v2's network alone on the GPU: FP16 against FP8 (examples/fp8.py), compiled and as the
AOTInductor package the recommender serves; TFLOP/s against the tensor cores' peak and each
form's error against the FP32 network.

    bash bench/gpu/run.sh dlrm-v2-network [--batches 4096,8192,16384,32768] [--packages fp16,fp8]

For each precision (fp16; fp8: per-tensor scales, the inputs' calibrated; fp8-rows: per-row
scales) the DCNv2 network of examples/dlrm_v2.py (bench/gpu/recsys/networks.py's builder, the
weights the served package is exported from) is
  * compiled by torch.compile (default mode, static shapes) at every batch and timed with CUDA
    events (--iters calls after warm-up);
  * for --packages, exported as a CUDA AOTInductor package with a dynamic batch (example batch
    --example-batch, fp16 rows in, as bench/gpu/dlrm_v2_perf.py exports the served one) and
    timed by bench/gpu/aoti_bare (libtorch's C++ package loader, as the backend loads it; Python's
    aoti_load_package crashes here): the median of CUDA-graph replays, as the recommender runs it;
  * compared with the FP32 network on --exact-batch inputs drawn like the served ones
    (examples/dlrm_v2.calibration_inputs with another seed): max and mean |diff| of the
    prediction, and the Pearson correlation of the predictions.
FLOPs: 2 x multiply-adds of every linear layer and the cross layers' products (32.06 MFLOP a
pair); peaks 989 TFLOP/s FP16, 1979 FP8 (H100 SXM, dense). Writes results.json and README.md
(a table per form) to --results.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

PEAK = {"fp16": 989.0, "fp8": 1979.0, "fp8-rows": 1979.0}


def inputs(batch, seed):
    import dlrm_v2
    dense, emb = dlrm_v2.calibration_inputs(batch, seed)
    return dense.cuda(), emb.cuda().half()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="4096,8192,16384,32768")
    p.add_argument("--precisions", default="fp16,fp8,fp8-rows")
    p.add_argument("--packages", default="fp16,fp8",
                   help="AOTInductor packages to export and time: PRECISION[:triton][:autotune] each, "
                        "`triton` the cross layers as our Triton kernels (fp16: cross_layer, fp8: cross_layer_fp8), "
                        "`autotune` Inductor's max_autotune")
    p.add_argument("--example-batch", type=int, default=16384)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--exact-batch", type=int, default=8192)
    p.add_argument("--results", default=os.environ.get("OUT", "/tmp") + "/dlrm-v2-network")
    p.add_argument("--work", default="/tmp/dlrm_v2_network")
    p.add_argument("--aoti-bare", default="/tmp/aoti_bare", help="bench/gpu/aoti_bare.cpp's binary")
    a = p.parse_args()
    import torch
    import aoti_export
    import dlrm_v2
    from dlrm_v2_perf import cuda_seconds
    from recsys.networks import dense_network, linear_flops

    os.makedirs(a.results, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    batches = [int(b) for b in a.batches.split(",")]
    gpu = torch.cuda.get_device_name(0)
    print(f"GPU: {gpu}; torch {torch.__version__}", flush=True)
    calib = dlrm_v2.calibration_inputs(4096, seed=0)
    ref32 = dense_network("dcnv2", "fp32", "cuda")
    dense_x, emb_x = inputs(a.exact_batch, seed=1)
    with torch.no_grad():
        want = ref32(dense_x, emb_x.float()).float()
    del ref32
    import triton_kernels
    out = {"gpu": gpu, "torch": torch.__version__, "batches": batches, "forms": {},
           "cross_configs": {"fp16": triton_kernels.cross_config_text(), "fp8": triton_kernels.cross_fp8_config_text()}}
    for prec in filter(None, a.precisions.split(",")):
        net = dense_network("dcnv2", prec, "cuda", calibration=calib if prec.startswith("fp8") else None)
        fpp, _ = linear_flops(net)
        exact = exactness(net, dense_x, emb_x, want)
        print(f"{prec}: against the FP32 network at batch {a.exact_batch}: max |diff| {exact['max_abs']:.2e}, "
              f"mean {exact['mean_abs']:.2e}, Pearson {exact['pearson']:.5f} (predictions' std "
              f"{exact['prediction_std']:.3f})", flush=True)
        forms = {"compiled": {}}
        t0 = time.time()
        # every precision's compiles counted afresh: past torch._dynamo's recompile limit (8
        # shapes of one forward) it would run the module eager and time that instead
        torch._dynamo.reset()
        compiled = torch.compile(net, dynamic=False)
        for b in batches:
            d, e = inputs(b, seed=2)
            with torch.no_grad():
                s = cuda_seconds(lambda i: compiled(d, e), a.iters)
            forms["compiled"][b] = s
            print(f"  {prec} compiled, batch {b}: {s * 1e3:.3f} ms, {b / s / 1e6:.2f} M pairs/s, "
                  f"{fpp * b / s / 1e12:.0f} TFLOP/s", flush=True)
        print(f"  ({time.time() - t0:.0f} s with the compiles)", flush=True)
        out["forms"][prec] = {"flops_per_pair": fpp, "peak_tflops": PEAK[prec], "exact": exact,
                              "seconds": {k: {str(b): s for b, s in v.items()} for k, v in forms.items()}}
        del net, compiled
        torch.cuda.empty_cache()
    write_results(a, out)
    for spec in filter(None, a.packages.split(",")):
        prec, cross, configs = package_form(spec)
        net = dense_network("dcnv2", prec, "cuda", cross=cross, calibration=calib if prec.startswith("fp8") else None)
        fpp, _ = linear_flops(net)
        exact = exactness(net, dense_x, emb_x, want)
        print(f"{spec}: against the FP32 network at batch {a.exact_batch}, eager: max |diff| {exact['max_abs']:.2e}, "
              f"mean {exact['mean_abs']:.2e}, Pearson {exact['pearson']:.5f}", flush=True)
        path = os.path.join(a.work, f"dcnv2_{spec.replace(':', '_')}.pt2")
        t0 = time.time()
        eb = a.example_batch
        example = (torch.rand(eb, 13, device="cuda"), (torch.randn(eb, 26, 128, device="cuda") * 0.05).half())
        with torch.no_grad():
            aoti_export.package(net, example, path, dynamic_batch=True, max_batch=max(batches), device="cuda",
                                inductor_configs=configs)
        export_s = time.time() - t0
        times = package_seconds(a, path, batches)
        for b, s in times.items():
            print(f"  {spec} package, batch {b}: {s * 1e3:.3f} ms (CUDA graph replay), {b / s / 1e6:.2f} M pairs/s, "
                  f"{fpp * b / s / 1e12:.0f} TFLOP/s (exported in {export_s:.0f} s)", flush=True)
        form = out["forms"].setdefault(spec, {"flops_per_pair": fpp, "peak_tflops": PEAK[prec], "exact": exact,
                                              "seconds": {}})
        form["seconds"]["package"] = {str(b): s for b, s in times.items()}
        del net
        torch.cuda.empty_cache()
        write_results(a, out)  # each package's figures kept should a later export run past the call
    return 0


def write_results(a, out):
    with open(os.path.join(a.results, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    write_readme(a, out)


def package_form(spec):
    """``PRECISION[:triton][:autotune]`` -> (precision, the cross layers' form, Inductor's settings)."""
    prec, *opts = spec.split(":")
    if prec not in PEAK or any(o not in ("triton", "autotune") for o in opts) or len(set(opts)) != len(opts):
        raise SystemExit(f"--packages {spec!r}: PRECISION[:triton][:autotune], PRECISION one of {', '.join(PEAK)}")
    return prec, "triton" if "triton" in opts else "torch", {"max_autotune": True} if "autotune" in opts else None


def exactness(net, dense_x, emb_x, want):
    """The network's predictions (eager) against the FP32 network's ``want``."""
    import torch
    with torch.no_grad():
        got = net(dense_x, emb_x).float()
    diff = (got - want).abs()
    corr = float(torch.corrcoef(torch.stack([got.flatten(), want.flatten()]))[0, 1])
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "pearson": corr,
            "prediction_std": float(want.std())}


def package_seconds(a, path, batches):
    """{batch: seconds} of the package's CUDA-graph replays (aoti_bare's median), inputs dense fp32
    [13] and rows fp16 [26, 128] (standard normal: the time does not depend on the values)."""
    cmd = [a.aoti_bare, "--package", path, "--batches", ",".join(map(str, batches)), "--iters", str(a.iters),
           "--warmup", "10", "--input", "float32:13", "--input", "float16:26,128"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print("  aoti_bare failed: " + p.stderr.strip()[-1500:], flush=True)
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            ms = r.get("graph_p50_ms") or r["plain_p50_ms"]
            out[int(r["batch"])] = ms / 1e3
    return out


def write_readme(a, out):
    lines = [f"# DLRM-v2's network alone: FP16 and FP8 — {out['gpu']}", "",
             "Written by `bench/gpu/dlrm_v2_network.py` (the numbers in `results.json`, everything printed in "
             "`console.log`). torch " + out["torch"] + ".", "",
             "Command: `bash bench/gpu/run.sh dlrm-v2-network " + " ".join(sys.argv[1:]).replace(a.results, "$RES") + "`", "",
             "The DCNv2 network of `examples/dlrm_v2.py` (the served package's weights). fp8: the large linear "
             "layers in float8 e4m3 (`examples/fp8.py`), per-tensor scales, the inputs' calibrated on inputs drawn "
             "like the served ones; fp8-rows: per-row and per-channel scales. `compiled`: torch.compile, default "
             "mode, static shapes, timed by CUDA events; `package`: the CUDA AOTInductor package with a dynamic "
             "batch, as the recommender serves it, its CUDA-graph replays timed by `aoti_bare` (median). "
             "`:triton`: the cross layers as our Triton kernels (`examples/triton_kernels.py`: fp16 `cross_layer`, "
             "FP8 `cross_layer_fp8`, the configuration in the command's environment or the default); "
             "`:autotune`: exported with Inductor's max_autotune. TFLOP/s count the network's products "
             "(32.06 MFLOP a pair) whatever their type."
             + ("" if "cross_configs" not in out else
                f" Kernel configurations: fp16 `{out['cross_configs']['fp16']}`, FP8 `{out['cross_configs']['fp8']}`."),
             "",
             "| precision | form | batch | ms | M pairs/s | TFLOP/s | % of its type's peak | % of the fp16 peak |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for prec, f in out["forms"].items():
        for form, times in f["seconds"].items():
            for b, s in times.items():
                tf = f["flops_per_pair"] * int(b) / s / 1e12
                lines.append(f"| {prec} | {form} | {int(b):,} | {s * 1e3:.3f} | {int(b) / s / 1e6:.2f} | {tf:.0f} | "
                             f"{100 * tf / f['peak_tflops']:.0f}% of {f['peak_tflops']:.0f} | "
                             f"{100 * tf / PEAK['fp16']:.0f}% |")
    lines += ["", "## Against the FP32 network (eager, batch " + str(a.exact_batch) + ")", "",
              "| precision | max abs diff | mean abs diff | Pearson | predictions' std |", "|---|---:|---:|---:|---:|"]
    for prec, f in out["forms"].items():
        e = f["exact"]
        lines.append(f"| {prec} | {e['max_abs']:.2e} | {e['mean_abs']:.2e} | {e['pearson']:.5f} | {e['prediction_std']:.3f} |")
    with open(os.path.join(a.results, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
