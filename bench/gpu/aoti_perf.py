#!/usr/bin/env python3
"""One model as an AOTInductor package and as TorchScript, served and bare, in one run on one GPU.

For --model (resnet50, bert, or a recommender's dense network: dlrm_dense, dcnv2_dense,
wide_deep_dense), FP16 as dense_perf.py deploys it (the same module and weights for both):

1. export: the TorchScript twin (torch.jit.script, `<m>_graphs/1/model.pt`, as dense_perf.py
   serves it) and the CUDA FP16 AOTInductor package (examples/aoti_export.py's `package`, a
   dynamic batch dimension up to the largest batch, `<m>_aoti_graphs/1/model.pt2`), exported
   here on this GPU with this torch;
2. bare: the TorchScript module in torch with inputs already on the GPU, eager and CUDA-graphed
   (dense_perf.py's `bare`), and the package in bench/gpu/aoti_bare (C++, libtorch's package
   loader: Python's aoti_load_package is not used), plain runs on a stream and a CUDA graph
   replayed, both timed with CUDA events;
3. served: tritonserver with both models on KIND_GPU, one instance each, dynamic batching with
   no queue delay and the measured batches preferred, `optimization { cuda { graphs: true
   graph_spec [...] } }` with a graph per measured batch captured at load (model_warmup);
   both checked against torch eager (batch 1, 3 padded into a larger graph, and the largest);
4. perf_analyzer: gRPC, inputs and outputs in CUDA shared memory, concurrency 1, at each batch;
5. the table in the seeds' columns (perf_analyzer's breakdown and percentiles) with the bare
   figures, and the issue's targets: served AOTI / bare TorchScript graph at the target batch
   (ResNet50 128: >= 1.5; BERT-large 16: >= 1.1), served AOTI / bare AOTI at the largest batch
   (>= 0.95), served batch-1 p50 / bare AOTI graph batch-1 median (<= 1.2), each PASS or MISS.

Writes $OUT/perf/ (perf_analyzer's CSVs, refs.json as dense_perf.py's, so bench/gpu/report.py
reads it; summary.json with the targets) and $OUT/perf/report.md.

    python3 bench/gpu/aoti_perf.py --model resnet50 --server .../tritonserver --backends /tmp/rust_backends \\
        --perf-analyzer /tmp/pa/perf_analyzer/bin/perf_analyzer --aoti-bare /tmp/aoti_bare
    python3 bench/gpu/aoti_perf.py --model bert --dry-run ...   # the plan and the commands, nothing run
"""
import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))

TOL = 5e-2  # fp16: |served - torch eager| per element
PCTS = ["p50 latency", "p90 latency", "p95 latency", "p99 latency"]

# per model: its label, the largest batch served, the batches measured, the batch of the
# AOTI-vs-TorchScript target and that target, the tensors (name, Triton type, dims without
# the batch), and perf_analyzer's input data
MODELS = {
    "resnet50": dict(label="ResNet50 FP16", mb=256, batches=[1, 128, 256], target_batch=128, target=1.5,
                     ins=[("INPUT__0", "TYPE_FP16", [3, 224, 224])], outs=[("OUTPUT__0", "TYPE_FP16", [1000])],
                     pa_extra=[]),
    "bert": dict(label="BERT-large QA FP16", mb=32, batches=[1, 16, 32], target_batch=16, target=1.1,
                 ins=[(f"INPUT__{i}", "TYPE_INT32", [384]) for i in range(3)],
                 outs=[(f"OUTPUT__{i}", "TYPE_FP16", [384]) for i in range(2)],
                 # ids, segments and mask of zeros: valid for every input
                 pa_extra=["--input-data", "zero"]),
}
for _m in ("dlrm", "dcnv2", "wide_deep"):
    MODELS[f"{_m}_dense"] = dict(label=f"{_m} dense network FP16", mb=65536, batches=[4096, 65536],
                                 target_batch=None, target=None, rec=_m, outs=[("OUTPUT__0", "TYPE_FP32", [1])],
                                 pa_extra=[])


def spec_for(name, dim=None):
    """The model's spec; a recommender's dense network gets its inputs once its width is known."""
    m = dict(MODELS[name], base=name)
    if m.get("rec"):
        m["ins"] = [("INPUT__0", "TYPE_FP32", [13]), ("INPUT__1", "TYPE_FP16", [26, dim or 128])]
    return m


def build_module(m, dev):
    """(module, feeds(batch) -> {name: numpy}) for a spec: the FP16 network as dense_perf.py and
    recsys_perf.py serve it (same seeds, so both formats hold the same weights)."""
    import torch
    rng = np.random.default_rng(0)
    if m["base"] == "resnet50":
        import torch_models
        torch.manual_seed(0)
        module = torch_models.make("resnet50_pt").half()

        def feeds(b):
            return {"INPUT__0": rng.standard_normal((b, 3, 224, 224)).astype(np.float16)}
    elif m["base"] == "bert":
        import torch_models
        from dense_perf import Bert16
        torch.manual_seed(0)
        module = Bert16(torch_models.make("bert_large_pt"))

        def feeds(b):
            seg = np.zeros((b, 384), np.int32)
            seg[:, 192:] = 1
            mask = np.ones((b, 384), np.int32)
            mask[:, 320:] = 0
            return {"INPUT__0": rng.integers(1, 30522, (b, 384)).astype(np.int32), "INPUT__1": seg, "INPUT__2": mask}
    else:
        from recsys.networks import dense_network
        module = dense_network(m["rec"], "fp16", "cpu")
        dim = module.m.model.dim
        m["ins"] = spec_for(m["base"], dim)["ins"]

        def feeds(b):
            return {"INPUT__0": rng.random((b, 13), dtype=np.float32),
                    "INPUT__1": (rng.standard_normal((b, 26, dim)) * 0.05).astype(np.float16)}
    return module.to(dev).eval(), feeds


def graph_buckets(m):
    return sorted(set(m["batches"]) | {m["mb"]})


def write_configs(repo, m, dense_perf, batcher=True):
    """`<m>_aoti_graphs` (the package) and `<m>_graphs` (TorchScript): the same config but the
    engine and the file; a CUDA graph per measured batch, captured at load; `batcher` False:
    no dynamic batching (Triton's default scheduler)."""
    buckets = graph_buckets(m)
    # the warm-up requests Triton runs at load capture each bucket's graph (3 runs each)
    warm = dense_perf.warmup_block(buckets, m["ins"], 3)
    ins = [dense_perf.tensor(n, t, d) for n, t, d in m["ins"]]
    outs = [dense_perf.tensor(n, t, d) for n, t, d in m["outs"]]
    names = {}
    for engine, name in (("aoti", f"{m['base']}_aoti_graphs"), ("torch", f"{m['base']}_graphs")):
        os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
        text = dense_perf.config(name, m["mb"], ins, outs, True, engine=engine, buckets=buckets, warmup=warm,
                                batcher=batcher)
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(text)
        names[engine] = name
    return names


def export(module, m, feeds, repo, names, dev, dry_run, inductor=(), example_batch=0):
    """The TorchScript twin and the CUDA package, in the folders the configs name. Returns the
    package's path and the seconds its export took. `example_batch`: the batch the package is
    exported with, Inductor's size hint for the batch dimension (0: the largest batch served;
    at least 2, as torch.export specialises a size of 1)."""
    import torch
    import aoti_export
    pt2 = os.path.join(repo, names["aoti"], "1", "model.pt2")
    pt = os.path.join(repo, names["torch"], "1", "model.pt")
    example_batch = aoti_export.example_batch(example_batch, m["mb"])
    kwargs = dict(dynamic_batch=True, max_batch=m["mb"], device="cuda")
    if inductor:
        kwargs["inductor_configs"] = aoti_export.parse_inductor_configs(inductor)
    if dry_run:
        # the call is checked against examples/aoti_export.py's signature, not made
        inspect.signature(aoti_export.package).bind(module, (), pt2, **kwargs)
        print(f"[dry run] aoti_export.package(<{m['label']}>, <example batch {example_batch}>, {pt2!r}, "
              + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")")
        print(f"[dry run] torch.jit.script(<{m['label']}>).save({pt!r})")
        return pt2, 0.0
    torch.jit.script(module).save(pt)
    example = tuple(torch.from_numpy(v).to(dev) for v in feeds(example_batch).values())
    t0 = time.time()
    with torch.no_grad():
        aoti_export.package(module, example, pt2, **kwargs)
    secs = time.time() - t0
    print(f"exported {pt2} ({os.path.getsize(pt2) / 1e6:.0f} MB, example batch {example_batch}) in {secs:.0f} s", flush=True)
    return pt2, secs


def aoti_bare_cmd(binary, pt2, batches, iters):
    return [binary, "--package", pt2, "--batches", ",".join(map(str, batches)), "--iters", str(iters), "--warmup", "10"]


def aoti_bare_runs(binary, pt2, batches):
    """aoti_bare's command lines: batch 1 with more iterations (its median is the target's
    denominator), the other batches in one more."""
    return [aoti_bare_cmd(binary, pt2, bs, iters)
            for bs, iters in (([b for b in batches if b == 1], 500), ([b for b in batches if b != 1], 50)) if bs]


def run_aoti_bare(binary, pt2, batches):
    """{batch: figures} from aoti_bare."""
    out = {}
    for cmd in aoti_bare_runs(binary, pt2, batches):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if p.stderr.strip():
            print("  " + p.stderr.strip().replace("\n", "\n  ")[-1500:], flush=True)
        if p.returncode != 0:
            raise SystemExit(f"aoti_bare failed ({p.returncode}): {' '.join(cmd)}")
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                out[r["batch"]] = r
    return out


def fmt_ms(us):
    return f"{us / 1e3:.2f}"


def perf_capi(a, repo, model, batch, out_dir, extra, torch, variant=None):
    """perf_analyzer's row for `model` at `batch` through Triton's C API: perf_analyzer loads
    libtritonserver.so from `a.capi_dir`/lib and the backends from `a.capi_dir`/backends, and
    serves a repository holding this model alone (inputs from its host memory, as perf_analyzer
    hands them to the request; its C API mode also takes system shared memory, and GPU memory
    by pointer). `variant` (capi_variants): its plugin is served, and its config without
    dynamic batching where it says so; its label names the files."""
    one = os.path.join(a.work, "capi_repo")
    shutil.rmtree(one, ignore_errors=True)
    os.makedirs(one)
    suffix = ""
    if variant is None:
        os.symlink(os.path.join(repo, model), os.path.join(one, model))
    else:
        suffix = "_" + variant["file_label"]
        os.makedirs(os.path.join(one, model))
        os.symlink(os.path.join(repo, model, "1"), os.path.join(one, model, "1"))
        with open(os.path.join(repo, model, "config.pbtxt")) as f:
            text = f.read()
        if variant["no_batcher"]:
            text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("dynamic_batching"))
        with open(os.path.join(one, model, "config.pbtxt"), "w") as f:
            f.write(text)
        shutil.copyfile(variant["plugin"], os.path.join(a.capi_dir, "backends", "rust", "libtriton_rust_aoti.so"))
    path = os.path.join(out_dir, f"{model}_b{batch}_c1_capi{suffix}.csv")
    cmd = [a.perf_analyzer, "-m", model, "-b", str(batch), "--concurrency-range", "1:1", "--service-kind", "triton_c_api",
           "--triton-server-directory", a.capi_dir, "--model-repository", one, "--measurement-interval",
           str(a.interval_ms), "--max-trials", str(a.max_trials), "-f", path, *extra]
    from tritonserver_process import capi_env
    env = capi_env(a.capi_dir, a.libtorch_dir or os.path.join(os.path.dirname(torch.__file__), "lib"))
    print("  " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    with open(os.path.join(out_dir, f"{model}_b{batch}_capi{suffix}.log"), "w") as f:
        f.write(p.stdout + "\n--- stderr\n" + p.stderr)
    if p.returncode != 0 or not os.path.exists(path):
        print(p.stdout[-1500:], p.stderr[-1500:])
        print(f"perf_analyzer (C API) gave no figure: rc {p.returncode}", flush=True)
        return None
    import dense_perf
    return dense_perf.read_row(path)


def capi_variants(text, rounds):
    """`--capi-variants` (LABEL=PLUGIN[:nobatcher],...) as the C API runs to make, in turn,
    `rounds` times over: each a dict with its label, plugin file and whether it serves
    without dynamic batching."""
    variants = []
    for item in filter(None, text.split(",")):
        label, _, spec = item.partition("=")
        plugin, _, flag = spec.partition(":")
        if not label or not plugin or flag not in ("", "nobatcher"):
            raise SystemExit(f"--capi-variants: '{item}' is not LABEL=PLUGIN[:nobatcher]")
        variants.append({"label": label, "plugin": os.path.abspath(plugin), "no_batcher": flag == "nobatcher"})
    return [dict(v, round=r, file_label=f"{v['label']}_r{r}") for r in range(1, rounds + 1) for v in variants]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--perf-analyzer", required=True)
    p.add_argument("--aoti-bare", required=True, help="the aoti_bare binary (bench/gpu/aoti_bare.cpp)")
    p.add_argument("--libtorch-dir", default="")
    p.add_argument("--work", default="/tmp/aoti_perf")
    p.add_argument("--port", type=int, default=18950)
    p.add_argument("--batches", default="", help="batches measured (default: the model's: 1, the target's, the largest)")
    p.add_argument("--max-batch", type=int, default=0, help="the largest batch served and exported (default: the model's)")
    p.add_argument("--interval-ms", type=int, default=2000, help="perf_analyzer's measurement window")
    p.add_argument("--max-trials", type=int, default=8, help="perf_analyzer's windows at most per figure")
    p.add_argument("--shared-memory", default="cuda", choices=["cuda", "system"])
    p.add_argument("--largest-concurrency", type=int, default=2,
                   help="the package at the largest batch also measured with this many requests in flight (1: not)")
    p.add_argument("--budget-s", type=float, default=480,
                   help="seconds this run may take: perf_analyzer runs that would start later are skipped (said so)")
    p.add_argument("--no-ts", action="store_true", help="serve and measure the package alone (no TorchScript twin)")
    p.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                   help="an Inductor setting for the package's export (e.g. max_autotune=true); repeatable")
    p.add_argument("--example-batch", type=int, default=0,
                   help="the batch the package is exported with, Inductor's size hint for the batch dimension "
                        "(default: the largest batch; earlier runs used 4)")
    p.add_argument("--capi-dir", default="",
                   help="a folder holding lib/libtritonserver.so and backends/rust/: batch 1 of the package is also "
                        "measured with perf_analyzer's C API mode (the server in perf_analyzer's process: no network)")
    p.add_argument("--capi-batches", default="1", help="batches measured in C API mode")
    p.add_argument("--no-batcher", action="store_true",
                   help="serve without dynamic batching (Triton's default scheduler: each request runs alone), "
                        "to compare the queue's time at batch 1 with and without the batcher")
    p.add_argument("--capi-variants", default="",
                   help="LABEL=PLUGIN[:nobatcher],...: batch 1 in C API mode once for each, in turn (--capi-rounds "
                        "times over), serving that libtriton_rust_aoti.so, without dynamic batching where it says "
                        "nobatcher: an A/B of builds and schedulers on one export")
    p.add_argument("--capi-rounds", type=int, default=1, help="how many times the --capi-variants are run in turn")
    p.add_argument("--verbose", action="store_true",
                   help="server --log-verbose=1: each run's `timing:` line in server.log, their averages printed")
    p.add_argument("--dry-run", action="store_true", help="write the configs and print the plan and commands; run nothing")
    a = p.parse_args()
    started = time.time()
    m = spec_for(a.model)
    if a.max_batch:
        m["mb"] = a.max_batch
        m["batches"] = sorted({b for b in m["batches"] if b < a.max_batch} | {a.max_batch})
    if a.batches:
        m["batches"] = [int(b) for b in a.batches.split(",")]
        m["mb"] = max(m["mb"], max(m["batches"]))
    out_dir = os.path.join(os.environ.get("OUT", "/tmp/out"), "perf")
    os.makedirs(out_dir, exist_ok=True)
    repo = os.path.join(a.work, "repo")
    shutil.rmtree(repo, ignore_errors=True)
    os.makedirs(repo)

    import dense_perf
    import torch
    dev = torch.device("cpu" if a.dry_run else "cuda:0")
    smi = "none (dry run)" if a.dry_run else subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    print(f"GPU: {smi}; torch {torch.__version__}; {m['label']}: largest batch {m['mb']}, measured at {m['batches']}", flush=True)

    # 1. export (the recommenders' dense networks are small enough to build in a dry run too)
    if a.dry_run and not m.get("rec"):
        module, feeds = None, None
    else:
        module, feeds = build_module(m, dev)
    names = write_configs(repo, m, dense_perf, batcher=not a.no_batcher)
    pt2, export_s = export(module, m, feeds, repo, names, dev, a.dry_run, a.inductor, a.example_batch)
    if a.no_ts:
        shutil.rmtree(os.path.join(repo, names.pop("torch")))

    # 2. bare references
    extra = ["--model-control-mode=none", f"--backend-config=rust,libtorch-dir={a.libtorch_dir or os.path.join(os.path.dirname(torch.__file__), 'lib')}"]
    if a.verbose:
        extra.append("--log-verbose=1")
    pa_runs = [(names[e], b) for b in m["batches"] for e in ("aoti", "torch") if e in names]

    def pa_cmd(model, batch):
        return [a.perf_analyzer, "-m", model, "-b", str(batch), "--concurrency-range", "1:1", "-i", "grpc",
                "-u", f"localhost:{a.port + 1}", "--shared-memory", a.shared_memory, "--output-shared-memory-size",
                str(8 << 20), "--measurement-interval", str(a.interval_ms), "--max-trials", str(a.max_trials),
                *m["pa_extra"]]
    if a.dry_run:
        for cmd in aoti_bare_runs(a.aoti_bare, pt2, m["batches"]):
            print("[dry run] " + " ".join(cmd))
        print(f"[dry run] bare TorchScript (dense_perf.bare) at batches {m['batches']}")
        print(f"[dry run] {a.server} --model-repository={repo} --backend-directory={a.backends} "
              f"--http-port={a.port} --grpc-port={a.port + 1} --metrics-port={a.port + 2} {' '.join(extra)}")
        for model, batch in pa_runs:
            print("[dry run] " + " ".join(pa_cmd(model, batch)) + f" -f {out_dir}/{model}_b{batch}_c1"
                  f"{'_cudashm' if a.shared_memory == 'cuda' else ''}.csv")
        for name in sorted(os.listdir(repo)):
            print(f"--- {name}/config.pbtxt\n{open(os.path.join(repo, name, 'config.pbtxt')).read()}", end="")
        return

    bare_aoti = run_aoti_bare(a.aoti_bare, pt2, m["batches"])
    for b, r in sorted(bare_aoti.items()):
        g = f", CUDA graph {r['graph_p50_ms']:.3f} ms (p99 {r['graph_p99_ms']:.3f}, {r['graph_ips']:.0f}/s)" if r["graph_p50_ms"] else ""
        if r.get("graph_call_p50_ms"):
            g += f"; a call as a server makes it (inputs copied in, replay, wait; host-timed) {r['graph_call_p50_ms']:.3f} ms"
        print(f"bare AOTI {m['label']} batch {b}: plain {r['plain_p50_ms']:.3f} ms (p99 {r['plain_p99_ms']:.3f}, "
              f"{r['plain_ips']:.0f}/s){g}", flush=True)
    bare_ts = {}
    if "torch" in names:
        ts = torch.jit.load(os.path.join(repo, names["torch"], "1", "model.pt"), map_location=dev).eval()
        for b in m["batches"]:
            def to_dev(n, b=b):
                return [torch.from_numpy(v).to(dev) for v in feeds(n).values()]
            e_ms, g_ms, e_ips, g_ips = dense_perf.bare(ts, to_dev, b, 300 if b == 1 else 30)
            bare_ts[b] = {"eager_ms": e_ms, "graph_ms": g_ms, "eager_ips": e_ips, "graph_ips": g_ips}
            print(f"bare TorchScript {m['label']} batch {b}: eager {e_ms:.3f} ms ({e_ips:.0f}/s)"
                  + (f", CUDA graph {g_ms:.3f} ms ({g_ips:.0f}/s)" if g_ms else ""), flush=True)
        del ts
    refs = {}
    if bare_ts:
        refs[m["base"]] = {"label": f"{m['label']} TorchScript", "max_batch": m["mb"], "modes": ["graphs"],
                           "engine": "torch", "online_ref": None, "bare": bare_ts}
    refs[f"{m['base']}_aoti"] = {
        "label": f"{m['label']} AOTInductor", "max_batch": m["mb"], "modes": ["graphs"], "engine": "aoti", "online_ref": None,
        "bare": {b: {"eager_ms": r["plain_p50_ms"], "graph_ms": r["graph_p50_ms"], "eager_ips": r["plain_ips"],
                     "graph_ips": r["graph_ips"], "eager_p99_ms": r["plain_p99_ms"], "graph_p99_ms": r["graph_p99_ms"]}
                 for b, r in bare_aoti.items()}}
    with open(os.path.join(out_dir, "refs.json"), "w") as f:
        json.dump({"gpu": smi, "torch": torch.__version__, "models": refs, "export_seconds": export_s}, f, indent=1)

    # 3.-4. served
    want = {}
    with torch.inference_mode():
        # the largest checked is capped at 4096 rows (a recommender's 65536 would send 436 MB over HTTP)
        for b in sorted({1, 3, min(m["mb"], 4096)}):
            f_in = feeds(b)
            got = module(*[torch.from_numpy(v).to(dev) for v in f_in.values()])
            got = [got] if isinstance(got, torch.Tensor) else list(got)
            want[b] = (f_in, [g.float().cpu().numpy() for g in got])
    del module
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    log = os.path.join(out_dir, "server.log")
    rows, skipped, wrong = {}, [], []
    t0 = time.time()
    with dense_perf.serve(a.server, repo, a.backends, a.port, log, extra=extra, timeout=900) as client:
        print(f"server ready in {time.time() - t0:.0f} s (graphs captured at load)", flush=True)
        for engine, name in names.items():
            onames = [n for n, _, _ in m["outs"]]
            for b, (f_in, w) in want.items():
                got = client.infer(name, f_in, onames)
                diff = max(float(np.abs(got[n].astype(np.float32) - x).max()) for n, x in zip(onames, w))
                print(f"check {name} batch {b} vs torch eager: max abs diff {diff:.2e} ({'within' if diff <= TOL else 'OVER'} {TOL})",
                      flush=True)
                if diff > TOL:
                    # measured all the same (a device call is dear), and said in the report
                    wrong.append(f"{name} batch {b}: max abs diff {diff:.2e}")
        # the largest batch also with requests in flight (one's transfer under the other's run)
        big = max(m["batches"])
        runs = [(model, batch, 1) for model, batch in pa_runs]
        if a.largest_concurrency > 1:
            runs.append((names["aoti"], big, a.largest_concurrency))
        for model, batch, conc in runs:
            if time.time() - started > a.budget_s:
                skipped.append((model, batch))
                print(f"(skipped: {model} batch {batch}, past the {a.budget_s:.0f} s budget)", flush=True)
                continue
            r = dense_perf.perf(a.perf_analyzer, a.port, model, batch, conc, out_dir,
                                [*m["pa_extra"], "--max-trials", str(a.max_trials)], shm=a.shared_memory, must=False,
                                interval_ms=a.interval_ms)
            if r is not None:
                rows[(model, batch) if conc == 1 else (model, batch, conc)] = r
                print(f"  {model} b={batch} c={conc}: {r['Inferences/Second']:.0f} infer/s, p50 {fmt_ms(r['p50 latency'])} ms, "
                      f"p99 {fmt_ms(r['p99 latency'])} ms", flush=True)

    # 4b. the same package served in perf_analyzer's own process (Triton's C API: no network)
    capi_batches = [int(b) for b in a.capi_batches.split(",") if b] if a.capi_dir else []
    for batch in capi_batches:
        if time.time() - started > a.budget_s:
            skipped.append((names["aoti"] + " (C API)", batch))
            continue
        r = perf_capi(a, repo, names["aoti"], batch, out_dir, m["pa_extra"], torch)
        if r is not None:
            rows[("capi", names["aoti"], batch)] = r
            print(f"  {names['aoti']} in-process (C API) b={batch}: {r['Inferences/Second']:.0f} infer/s, "
                  f"p50 {fmt_ms(r['p50 latency'])} ms, p99 {fmt_ms(r['p99 latency'])} ms", flush=True)

    # 4c. the A/B: each variant in turn, the plugin served put back afterwards
    variants = capi_variants(a.capi_variants, a.capi_rounds) if a.capi_dir else []
    if variants:
        served = os.path.join(a.capi_dir, "backends", "rust", "libtriton_rust_aoti.so")
        kept = served + ".kept"
        shutil.copyfile(served, kept)
        try:
            for v in variants:
                if time.time() - started > a.budget_s:
                    skipped.append((names["aoti"] + f" (C API, {v['file_label']})", 1))
                    continue
                r = perf_capi(a, repo, names["aoti"], 1, out_dir, m["pa_extra"], torch, variant=v)
                if r is not None:
                    rows[("capi", names["aoti"], 1, v["file_label"])] = r
                    print(f"  {names['aoti']} in-process (C API) b=1 {v['file_label']}: "
                          f"{r['Inferences/Second']:.0f} infer/s, p50 {fmt_ms(r['p50 latency'])} ms, "
                          f"p99 {fmt_ms(r['p99 latency'])} ms, queue {fmt_ms(r.get('Server Queue', 0))} ms, "
                          f"compute infer {fmt_ms(r.get('Server Compute Infer', 0))} ms", flush=True)
        finally:
            shutil.copyfile(kept, served)
            os.remove(kept)

    # 5. the table and the targets
    lines = [f"# {m['label']}: AOTInductor and TorchScript served (perf_analyzer, gRPC, "
             f"{a.shared_memory} shared memory, concurrency 1 unless the batch says c2) and bare", "",
             f"GPU: {smi}; torch {torch.__version__}; package exported in {export_s:.0f} s; latencies in ms", ""]
    cols = ["served", "batch", "Inferences/Second", *dense_perf.LATENCY_PARTS, "p50", "p90", "p95", "p99", "Avg latency",
            "bare TS graph/s", "bare AOTI graph/s", "served/bare TS graph", "served/bare AOTI"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for key, r in rows.items():
        capi = key[0] == "capi"
        label = ""
        if capi:
            key = key[1:]
            if len(key) > 2:
                label, key = f", {key[2]}", key[:2]
        model, batch = key[0], key[1]
        ts_g = (bare_ts.get(batch) or {}).get("graph_ips")
        ao = bare_aoti.get(batch) or {}
        ao_best = max(x for x in (ao.get("graph_ips"), ao.get("plain_ips"), 0.0) if x is not None)
        served = "AOTI" if model == names["aoti"] else "TorchScript"
        cells = [served + (f" in-process (C API{label})" if capi else ""), str(batch) + (f" c{key[2]}" if len(key) > 2 else ""), f"{r['Inferences/Second']:.0f}",
                 *[fmt_ms(r.get(k, 0.0)) for k in dense_perf.LATENCY_PARTS], *[fmt_ms(r[k]) for k in PCTS], fmt_ms(r["Avg latency"]),
                 f"{ts_g:.0f}" if ts_g else "-", f"{ao.get('graph_ips') or 0:.0f}",
                 f"{r['Inferences/Second'] / ts_g:.2f}" if ts_g else "-",
                 f"{r['Inferences/Second'] / ao_best:.2f}" if ao_best else "-"]
        lines.append("| " + " | ".join(cells) + " |")

    targets = []

    def target(what, value, bound, higher):
        ok = value is not None and (value >= bound if higher else value <= bound)
        targets.append({"target": what, "value": value, "bound": f"{'>=' if higher else '<='} {bound}", "pass": ok})

    aoti = names["aoti"]
    tb = m["target_batch"]
    if tb and (aoti, tb) in rows and (bare_ts.get(tb) or {}).get("graph_ips"):
        target(f"served AOTI / bare TorchScript CUDA graph, batch {tb}",
               rows[(aoti, tb)]["Inferences/Second"] / bare_ts[tb]["graph_ips"], m["target"], True)
    big = max(m["batches"])
    served_big = [r["Inferences/Second"] for k, r in rows.items() if k[0] == aoti and k[1] == big]
    if served_big and big in bare_aoti:
        best = max(x for x in (bare_aoti[big]["graph_ips"], bare_aoti[big]["plain_ips"]) if x)
        target(f"served AOTI (the better of concurrency 1 and {a.largest_concurrency}) / bare AOTI (the better of plain and graph), batch {big}",
               max(served_big) / best, 0.95, True)
    if (aoti, 1) in rows and (bare_aoti.get(1) or {}).get("graph_p50_ms"):
        target("served AOTI p50 / bare AOTI CUDA graph median, batch 1",
               rows[(aoti, 1)]["p50 latency"] / 1e3 / bare_aoti[1]["graph_p50_ms"], 1.2, False)
    if ("capi", aoti, 1) in rows and (bare_aoti.get(1) or {}).get("graph_p50_ms"):
        target("served AOTI in-process (perf_analyzer C API, no network) p50 / bare AOTI CUDA graph median, batch 1",
               rows[("capi", aoti, 1)]["p50 latency"] / 1e3 / bare_aoti[1]["graph_p50_ms"], 1.2, False)
    lines += ["", "| target | value | bound | |", "|---|---|---|---|"]
    for t in targets:
        v = "-" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"| {t['target']} | {v} | {t['bound']} | "
                     f"{'PASS' if t['pass'] else 'MISS'} |")
    call = (bare_aoti.get(1) or {}).get("graph_call_p50_ms")
    if call:
        # context for the batch-1 rows, not a target: the bare package called the way the
        # server calls it, so that what the server adds stands apart from GPU time
        served = [(label, rows[k]["p50 latency"] / 1e3) for label, k in
                  (("gRPC", (aoti, 1)), ("in-process", ("capi", aoti, 1))) if k in rows]
        lines += ["", f"batch 1, where the time goes: the bare package called as a server calls it (inputs copied into the "
                      f"graph's, replay, stream wait; host-timed p50) {call:.3f} ms against {bare_aoti[1]['graph_p50_ms']:.3f} ms "
                      f"of CUDA-event time; served p50 " +
                      ", ".join(f"{label} {v:.3f} ms ({v / call:.2f}x the call)" for label, v in served)]
    if skipped:
        lines += ["", "not measured (time budget): " + ", ".join(f"{n} b{b}" for n, b in skipped)]
    if wrong:
        lines += ["", f"WRONG ANSWERS (served vs torch eager over {TOL}): " + "; ".join(wrong)]
    report = "\n".join(lines) + "\n"
    print("\n" + report, flush=True)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(report)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"model": m["base"], "gpu": smi, "export_seconds": export_s, "targets": targets,
                   "skipped": skipped, "wrong": wrong, "seconds": time.time() - started}, f, indent=1)
    if a.verbose:
        import timing_summary
        print("where a run's time went in the server (its verbose timing lines, us: the mean, which counts "
              "the warm-up and the checks' larger batches too, and the median):")
        for (kind, label), (mean, median, _p99, count) in timing_summary.summarize(log).items():
            print(f"  {kind}: {label} {mean:.0f} / p50 {median} ({count} lines)")
    print("server log lines about CUDA graphs:")
    with open(log) as f:
        for line in f:
            if "CUDA graph" in line:
                print("  " + line.strip()[:200])
    if wrong:
        raise SystemExit("wrong answers: " + "; ".join(wrong))


if __name__ == "__main__":
    main()
