#!/usr/bin/env python3
"""Dense models served with and without CUDA graphs, against the bare engine (issue 9).

ResNet50, BERT-large QA and FastPitch in FP16 (TorchScript; fp16 inputs and outputs as the
seeds deploy them; BERT's ids stay int32). Writes server models `<m>_eager` and
`<m>_graphs` (`optimization { cuda { graphs: true } }`; FastPitch has no graphs mode: its
output length is decided on the host), one instance and no queue delay (offline), plus
`resnet50_online` (graphs, two instances, 200 us queue delay), and measures in one run
on one GPU:

- bare: the very model.pt the server loads, in torch with inputs already on the GPU,
  eager and CUDA-graphed, at every batch measured (median latency, items/s);
- correctness: every mode's served outputs against torch eager within the fp16
  tolerance (batch 3 is padded into the graph of 4);
- offline: NVIDIA's perf_analyzer, gRPC, system shared memory, concurrency 1, at batch 1
  and the largest (`--sweep`: every power of two between; `--cuda-shm`: the largest
  batch with CUDA shared memory too);
- online (`--online`, default ResNet50): requests of batch 1 with dynamic batching, at the
  `--concurrency` values, against the bare engine at batch 64 or the model's largest below
  it (`<m>_online`: two instances and, where the model has graphs, a CUDA graph every 8
  rows up to 64 which the batcher prefers, captured at load by model_warmup);
- ONNX (`--ort-lib`, onnxruntime-gpu's library, and `--ort-bare`, the ort_bare example):
  ResNet50 and BERT-large QA in FP16 built by examples/export_models.py, served by the ONNX
  engine on KIND_GPU (inputs and outputs bound in GPU memory; `_graphs`: ONNX Runtime's
  CUDA graphs), checked against ONNX Runtime on the CPU running the same file, measured
  like the TorchScript ones against bare ONNX Runtime (ort_bare: the same library and
  file, inputs and outputs already on the GPU).

perf_analyzer's CSV files and the bare figures (refs.json) go to $OUT/perf/;
bench/gpu/report.py turns them into seed-style tables and plots.

    python3 bench/gpu/dense_perf.py --server $PYT/pytriton/tritonserver/bin/tritonserver \\
        --backends /tmp/rust_backends --perf-analyzer /tmp/pa/perf_analyzer/bin/perf_analyzer
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import torch_models  # noqa: E402
from tritonserver_process import serve  # noqa: E402
from host_qos import add_host_args, apply_host_args  # noqa: E402

TOL = 5e-2  # fp16: |served - torch eager| per element


def config(name, max_batch, inputs, outputs, graphs, delay_us=0, count=1, engine="torch", buckets=(), warmup="",
           batcher=True, params=()):
    """A GPU model's config.pbtxt. `buckets`: CUDA graph batch sizes (graph_spec), also the
    dynamic batcher's preferred sizes, so that batches land on a graph without padding;
    `warmup`: a model_warmup block (Triton runs it at load: graphs are captured then);
    `batcher`: False leaves dynamic batching out (Triton's default scheduler); `params`: more
    model parameters (key, value)."""
    spec = "".join(f" graph_spec {{ batch_size: {b} }}" for b in buckets)
    opt = f"optimization {{ cuda {{ graphs: true{spec} }} }}\n" if graphs else ""
    preferred = f" preferred_batch_size: [ {', '.join(str(b) for b in buckets if b >= 8)} ]" if buckets else ""
    return (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: {max_batch}\n'
            f'input [ {", ".join(inputs)} ]\noutput [ {", ".join(outputs)} ]\n'
            + (f'dynamic_batching {{ max_queue_delay_microseconds: {delay_us}{preferred} }}\n' if batcher else '') +
            f'instance_group [ {{ count: {count} kind: KIND_GPU gpus: [ 0 ] }} ]\n{opt}{warmup}'
            f'parameters {{ key: "engine" value {{ string_value: "{engine}" }} }}\n'
            + "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params))


def warmup_block(buckets, inputs, runs):
    """model_warmup: `runs` requests of each bucket's batch size (zeros); `inputs`:
    (name, data type, dims) of every input."""
    def one(b):
        ins = " ".join(f'inputs {{ key: "{n}" value {{ data_type: {t} dims: [ {", ".join(map(str, d))} ] zero_data: true }} }}'
                       for n, t, d in inputs)
        return f'{{ name: "b{b}" batch_size: {b} count: {runs} {ins} }}'
    return f"model_warmup [ {', '.join(one(b) for b in buckets)} ]\n"


def tensor(name, dtype, dims):
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(map(str, dims))} ] }}'


class Bert16(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m.half()

    def forward(self, ids, seg, mask):
        s, e = self.m(ids, seg, mask)
        return s, e


def bare(module, make_inputs, batch, iters):
    """(eager median ms, graph median ms, eager items/s, graph items/s) at `batch`; the
    graph figures are None for a model that cannot be captured (FastPitch's durations
    decide its output length on the host)."""
    xs = make_inputs(batch)
    with torch.inference_mode():
        for _ in range(5):
            module(*xs)
        torch.cuda.synchronize()
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            module(*xs)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
    eager = float(np.median(ts))
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad():
            with torch.cuda.stream(s):
                for _ in range(3):
                    module(*xs)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                module(*xs)
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            ts = []
            for _ in range(iters):
                t0 = time.perf_counter()
                g.replay()
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
        graph = float(np.median(ts))
    except Exception as e:  # noqa: BLE001 - capture refused: report eager only
        print(f"  (no bare CUDA graph at batch {batch}: {str(e).splitlines()[0][:120]})")
        torch.cuda.synchronize()
        return eager * 1e3, None, batch / eager, None
    return eager * 1e3, graph * 1e3, batch / eager, batch / graph


class Timing:
    """Averages the backend's verbose `timing:` lines (server run with --log-verbose=1)
    written since the last call: where a batch's time goes inside the server."""

    def __init__(self, log_path):
        self.log_path, self.offset = log_path, 0

    def since_last(self):
        from timing_summary import averages
        with open(self.log_path) as f:
            f.seek(self.offset)
            text = f.read()
            self.offset = f.tell()
        return ", ".join(f"{label} {avg:.0f}" for (_, label), (avg, _) in averages(text.splitlines()).items())


def perf(pa, port, model, batch, conc, out_dir, extra=(), shm="system", must=True, protocol="grpc", interval_ms=4000):
    """perf_analyzer's row for `model` at `batch` and concurrency `conc`; `protocol`: grpc
    (the file name as before) or http (the file name ends in _http); `interval_ms`: its
    measurement window."""
    path = os.path.join(out_dir, f"{model}_b{batch}_c{conc}{'_cudashm' if shm == 'cuda' else ''}"
                                 f"{'_http' if protocol == 'http' else ''}.csv")
    cmd = [pa, "-m", model, "-b", str(batch), "--concurrency-range", f"{conc}:{conc}", "-i", protocol,
           "-u", f"localhost:{port + 1 if protocol == 'grpc' else port}", "--shared-memory", shm, "--output-shared-memory-size", str(8 << 20),
           "--measurement-interval", str(interval_ms), "-f", path, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        if not must:
            print(f"perf_analyzer gave no figure: {' '.join(cmd)}", flush=True)
            return None
        raise SystemExit(f"perf_analyzer failed: {' '.join(cmd)}")
    return read_row(path)


LATENCY_PARTS = ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
                 "Server Compute Infer", "Server Compute Output", "Client Recv")


def read_row(path):
    """The first row of a perf_analyzer CSV (-f) as numbers, with its average latency: the CSV
    has no average column, so it is the sum of its parts (a part the CSV lacks, as the network
    in C API mode, counts 0)."""
    with open(path) as f:
        row = next(csv.DictReader(f))
    r = {k: float(v) for k, v in row.items() if v not in ("", None)}
    r["Avg latency"] = sum(r.get(k, 0.0) for k in LATENCY_PARTS)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--perf-analyzer", required=True)
    p.add_argument("--libtorch-dir", default=os.path.join(os.path.dirname(torch.__file__), "lib"))
    p.add_argument("--work", default="/tmp/dense_perf")
    p.add_argument("--port", type=int, default=18900)
    p.add_argument("--only", default="", help="resnet50,bert,fastpitch")
    p.add_argument("--batches", default="", help="offline batches (comma-separated; default 1 and the largest, or the sweep)")
    p.add_argument("--check-batches", type=lambda v: [int(b) for b in v.split(",")], default=None,
                   help="batches of the correctness check (default 1, 3 and the model's largest: 3 is padded into "
                        "the graph of 4, the largest takes the multi-threaded upload); each is a shape the served "
                        "modules see before they are measured")
    p.add_argument("--torch-param", action="append", default=[], metavar="KEY=VALUE",
                   help="a model parameter for every TorchScript model, e.g. ENABLE_JIT_PROFILING=false (repeatable)")
    p.add_argument("--no-offline-batcher", action="store_true",
                   help="offline models without dynamic_batching (Triton's default scheduler: one hand-off fewer "
                        "between Triton's threads at concurrency 1)")
    p.add_argument("--no-online", action="store_true", help="skip the online (concurrency) measurements")
    p.add_argument("--protocol", type=lambda v: v.split(","), default=["grpc"],
                   help="perf_analyzer's protocols for the offline rows: grpc, http or grpc,http (both, each row "
                        "twice; HTTP files end in _http); online rows use the first")
    p.add_argument("--graphs-only", action="store_true",
                   help="serve and measure only the graphs mode of models that have one (not eager)")
    p.add_argument("--online", default="resnet50",
                   help="models measured online too (comma-separated bases, e.g. resnet50,bert,fastpitch,resnet50_onnx)")
    p.add_argument("--sweep", action="store_true", help="offline: every power-of-two batch up to the largest (else 1 and the largest)")
    p.add_argument("--concurrency", type=lambda v: [int(c) for c in v.split(",")], default=[64],
                   help="online concurrencies (comma-separated; default 64)")
    p.add_argument("--timing", action="store_true",
                   help="serve with --log-verbose=1 and print the backend's own time breakdown after each measurement")
    p.add_argument("--cuda-shm", action="store_true", help="also measure the largest batch with CUDA shared memory")
    p.add_argument("--ort-lib", default="", help="onnxruntime-gpu's libonnxruntime.so: also serve the ONNX models "
                   "(resnet50_onnx, bert_onnx) on KIND_GPU, against CPU ONNX Runtime and bare ONNX Runtime")
    p.add_argument("--ort-bare", default="", help="the ort_bare binary (bare ONNX Runtime reference)")
    add_host_args(p)
    a = p.parse_args()
    apply_host_args(a)
    if not set(a.protocol) <= {"grpc", "http"}:
        p.error(f"--protocol: grpc and/or http, not {a.protocol}")
    out_dir = os.path.join(os.environ.get("OUT", "/tmp/out"), "perf")
    os.makedirs(out_dir, exist_ok=True)
    repo = os.path.join(a.work, "repo")
    os.makedirs(repo, exist_ok=True)
    dev = torch.device("cuda:0")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print(f"GPU: {smi}; torch {torch.__version__}")
    only = set(filter(None, a.only.split(",")))

    def batches(mb):
        if a.batches:
            return [int(b) for b in a.batches.split(",") if int(b) <= mb]
        sweep = [b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b < mb] + [mb]
        return sweep if a.sweep else [1, mb]

    def save(module, base):
        path = os.path.join(repo, f"{base}_eager", "1", "model.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.jit.script(module.eval()).save(path)

    rng_resnet, rng_bert = np.random.default_rng(0), np.random.default_rng(1)

    def bert_feeds(b, rng=rng_bert):
        seg = np.zeros((b, 384), np.int32)
        seg[:, 192:] = 1
        mask = np.ones((b, 384), np.int32)
        mask[:, 320:] = 0
        return {"input__0": rng.integers(1, 30522, (b, 384)).astype(np.int32), "input__1": seg, "input__2": mask}
    # what a model is served as; the TorchScript and ONNX files share these
    models_by_base = {
        "resnet50": dict(
            label="ResNet50 FP16", base="resnet50", mb=128, batches=batches(128),
            warm=[("INPUT__0", "TYPE_FP16", [3, 224, 224])],
            ins=[tensor("INPUT__0", "TYPE_FP16", [3, 224, 224])], outs=[tensor("OUTPUT__0", "TYPE_FP16", [1000])],
            feeds=lambda b, rng=rng_resnet: {"INPUT__0": rng.standard_normal((b, 3, 224, 224)).astype(np.float16)},
            onames=["OUTPUT__0"], pa_extra=[], modes=("eager", "graphs")),
        "bert": dict(
            label="BERT-large QA FP16", base="bert", mb=16, batches=batches(16),
            warm=[(f"input__{i}", "TYPE_INT32", [384]) for i in range(3)],
            ins=[tensor(f"input__{i}", "TYPE_INT32", [384]) for i in range(3)],
            outs=[tensor(f"output__{i}", "TYPE_FP16", [384]) for i in range(2)],
            feeds=bert_feeds, onames=["output__0", "output__1"], pa_extra=["--input-data", "zero"],
            modes=("eager", "graphs")),
    }
    models = []
    if not only or "resnet50" in only:
        torch.manual_seed(0)
        save(torch_models.make("resnet50_pt").half(), "resnet50")
        models.append(models_by_base["resnet50"])
    if not only or "bert" in only:
        torch.manual_seed(0)
        save(Bert16(torch_models.make("bert_large_pt")), "bert")
        models.append(models_by_base["bert"])
    if not only or "fastpitch" in only:
        torch.manual_seed(0)
        save(torch_models.make("fastpitch").half(), "fastpitch")
        # perf_analyzer sends one real utterance (ids 1..147, padded with 0) in every row
        ids = torch_models.fastpitch_inputs(1, seed=5).numpy()[0]
        data = os.path.join(a.work, "fastpitch_input.json")
        with open(data, "w") as f:
            json.dump({"data": [{"INPUT__0": {"content": ids.tolist(), "shape": [128]}}]}, f)
        models.append(dict(
            label="FastPitch FP16", base="fastpitch", mb=8, batches=batches(8),
            ins=[tensor("INPUT__0", "TYPE_INT64", [128])],
            outs=[tensor("OUTPUT__0", "TYPE_FP16", [80, -1]), tensor("OUTPUT__1", "TYPE_INT64", [1]),
                  tensor("OUTPUT__2", "TYPE_FP16", [128]), tensor("OUTPUT__3", "TYPE_FP16", [128])],
            feeds=lambda b: {"INPUT__0": torch_models.fastpitch_inputs(b, seed=3).numpy()},
            onames=["OUTPUT__0", "OUTPUT__1", "OUTPUT__2", "OUTPUT__3"], pa_extra=["--input-data", data],
            # the mel length comes from predicted durations (a host decision): no CUDA graph
            modes=("eager",), frames=1, skip=("OUTPUT__0", "OUTPUT__1")))
    want_onnx = [b for b in ("resnet50_onnx", "bert_onnx") if not only or b in only]
    if want_onnx and not a.ort_lib:
        print(f"(no --ort-lib: the ONNX models {want_onnx} are not served)")
    elif want_onnx:
        import export_models
        onnx_specs = {
            # the seeds' FP16 deployments, built by examples/export_models.py (own weights)
            "resnet50_onnx": ("resnet50_fp16", "ResNet50 FP16 ONNX", models_by_base["resnet50"]),
            "bert_onnx": ("bert_large_fp16", "BERT-large QA FP16 ONNX", models_by_base["bert"]),
        }
        for base in want_onnx:
            builder, label, like = onnx_specs[base]
            path = os.path.join(repo, f"{base}_eager", "1", "model.onnx")
            if not os.path.exists(path):
                t0 = time.time()
                export_models.build_model(builder, path)
                print(f"built {builder} -> {path} ({os.path.getsize(path) / 1e6:.0f} MB, {time.time() - t0:.0f} s)", flush=True)
            models.append(dict(like, label=label, base=base, engine="onnx", file="model.onnx",
                               modes=("eager", "graphs")))
    # --graphs-only: the eager model is still written (the others link its file) and loaded, not measured
    served_modes = {m["base"]: [md for md in m["modes"] if not (a.graphs_only and md == "eager" and "graphs" in m["modes"])]
                    for m in models}
    online = set() if a.no_online else set(filter(None, a.online.split(",")))
    for m in models:
        m["online"] = m["base"] in online
        # the bare engine an online row is held against: batch 64, or the largest below it
        m["online_ref"] = min(64, m["mb"])
    for m in models:
        # offline (clients send whole batches): one instance, no queue delay; online
        # (requests of batch 1): two instances, so one stages a batch while the other
        # computes, and 200 us for a batch to gather
        for mode in m["modes"] + (("online",) if m["online"] else ()):
            name = f"{m['base']}_{mode}"
            os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
            file, engine = m.get("file", "model.pt"), m.get("engine", "torch")
            params = [tuple(kv.split("=", 1)) for kv in a.torch_param] if engine == "torch" else []
            if mode != "eager":
                src, dst = os.path.join(repo, f"{m['base']}_eager", "1", file), os.path.join(repo, name, "1", file)
                if not os.path.exists(dst):
                    os.link(src, dst)
            with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
                if mode == "online" and "graphs" in m["modes"]:
                    # a graph every 8 rows up to 64, which the batcher prefers, all captured
                    # at load by model_warmup (torch: 3 eager runs, then the capture)
                    buckets = [b for b in [1, 2, 4, *range(8, 65, 8), 96, 128] if b < m["mb"]] + [m["mb"]]
                    warm = warmup_block(buckets, m["warm"], 4)
                    f.write(config(name, m["mb"], m["ins"], m["outs"], True, delay_us=200, count=2, engine=engine,
                                   buckets=buckets, warmup=warm, params=params))
                elif mode == "online":
                    f.write(config(name, m["mb"], m["ins"], m["outs"], False, delay_us=200, count=2, engine=engine,
                                   params=params))
                else:
                    f.write(config(name, m["mb"], m["ins"], m["outs"], mode == "graphs", engine=engine,
                                   batcher=not a.no_offline_batcher, params=params))

    # the repository holds this run's models only (a model left by an earlier run on this
    # machine would be loaded too: --model-control-mode=none); built ONNX files are kept
    ours = {f"{m['base']}_{mode}" for m in models for mode in m["modes"] + (("online",) if m["online"] else ())}
    for d in os.listdir(repo):
        if d not in ours:
            shutil.rmtree(os.path.join(repo, d))

    # bare references: the files the server loads, at every batch measured
    refs, modules = {}, {}
    for m in models:
        bare_at = {}
        batches_m = sorted(set(m["batches"]) | ({m["online_ref"]} if m["online"] else set()))
        if m.get("engine") == "onnx":
            # bare ONNX Runtime (the same library and file, no server): ort_bare
            model_file = os.path.join(repo, f"{m['base']}_eager", "1", "model.onnx")
            modules[m["base"]] = model_file
            p = subprocess.run([a.ort_bare, "--lib", a.ort_lib, "--model", model_file,
                                "--batches", ",".join(map(str, batches_m)), "--iters", "50"],
                               capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                raise SystemExit(f"ort_bare failed: {p.stderr[-3000:]}")
            if p.stderr.strip():
                print("  ort_bare: " + p.stderr.strip()[-600:])
            found = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
            for r in found:
                bare_at[r["batch"]] = {k: r[k] for k in ("eager_ms", "graph_ms", "eager_ips", "graph_ips")}
        else:
            module = torch.jit.load(os.path.join(repo, f"{m['base']}_eager", "1", "model.pt"), map_location=dev).eval()
            modules[m["base"]] = module
            to_dev = lambda b, m=m: [torch.from_numpy(v).to(dev) for v in m["feeds"](b).values()]  # noqa: E731
            for b in batches_m:
                e_ms, g_ms, e_ips, g_ips = bare(module, to_dev, b, 300 if b == 1 else 30)
                bare_at[b] = {"eager_ms": e_ms, "graph_ms": g_ms, "eager_ips": e_ips, "graph_ips": g_ips}
        for b, r in sorted(bare_at.items()):
            print(f"bare {m['label']} batch {b}: eager {r['eager_ms']:.2f} ms ({r['eager_ips']:.0f}/s)"
                  + (f", CUDA graph {r['graph_ms']:.2f} ms ({r['graph_ips']:.0f}/s)" if r["graph_ms"] else ""), flush=True)
        refs[m["base"]] = {"label": m["label"], "max_batch": m["mb"], "modes": list(m["modes"]), "bare": bare_at,
                           "engine": m.get("engine", "torch"), "online_ref": m["online_ref"]}
    with open(os.path.join(out_dir, "refs.json"), "w") as f:
        json.dump({"gpu": smi, "torch": torch.__version__, "models": refs}, f, indent=1)

    extra = ["--model-control-mode=none", f"--backend-config=rust,libtorch-dir={a.libtorch_dir}"]
    if a.ort_lib:
        extra.append(f"--backend-config=rust,onnxruntime-library={a.ort_lib}")
    if a.timing:
        extra.append("--log-verbose=1")
    timing = Timing("/tmp/dense_perf_server.log")
    with serve(a.server, repo, a.backends, a.port, "/tmp/dense_perf_server.log", extra=extra) as client:
        # correctness: every mode against torch eager, and the ONNX models against ONNX
        # Runtime on the CPU running the same file (batch 3 is padded into the bucket of 4)
        for m in models:
            module = modules[m["base"]]
            for b in a.check_batches or (1, 3, m["mb"]):
                f = m["feeds"](b)
                if m.get("engine") == "onnx":
                    cpu = export_models.run_onnxruntime(module, f)
                    want = [cpu[n] for n in m["onames"]]
                else:
                    with torch.inference_mode():
                        want = module(*[torch.from_numpy(v).to(dev) for v in f.values()])
                    want = [w.cpu().numpy() for w in ([want] if isinstance(want, torch.Tensor) else want)]
                for mode in served_modes[m["base"]] + (["online"] if m["online"] else []):
                    got = client.infer(f"{m['base']}_{mode}", f, m["onames"])
                    pairs = [(n, got[n], w) for n, w in zip(m["onames"], want)]
                    # FastPitch: the mel length (OUTPUT__1) is the sum of rounded fp16 durations, so a
                    # duration at a rounding edge moves it by a frame (and shifts every
                    # frame after it); its durations and pitch are compared, and the
                    # lengths within one frame
                    slack = [(n, g.shape, w.shape) for n, g, w in pairs if g.shape != w.shape]
                    if any(len(gs) != len(ws) or gs[:-1] != ws[:-1] or abs(gs[-1] - ws[-1]) > m.get("frames", 0)
                           for _, gs, ws in slack):
                        raise SystemExit(f"wrong answer: shapes {slack}")
                    diff = max(float(np.abs(g.astype(np.float32) - w.astype(np.float32)).max())
                               for n, g, w in pairs if g.shape == w.shape and n not in m.get("skip", ()))
                    ok = diff <= TOL
                    versus = "CPU ONNX Runtime" if m.get("engine") == "onnx" else "torch eager"
                    print(f"check {m['label']} {mode} batch {b} vs {versus}: max abs diff {diff:.2e} "
                          f"({'within' if ok else 'OVER'} {TOL})"
                          + (f"; lengths {[(n, gs[-1], ws[-1]) for n, gs, ws in slack]} (within a frame)" if slack else ""))
                    if not ok:
                        raise SystemExit("wrong answer")
        print()
        print(f"{'model':<20} {'mode':<7} {'batch':>5} {'conc':>4} {'infer/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'avg ms':>7} {'infer ms':>8} {'bare eager':>10} {'bare graph':>10} {'served/bare':>11}")
        timing.since_last()

        def show(m, mode, batch, conc, r, ref, note=""):
            if batch == 1 and conc == 1:
                best = ref["graph_ms"] or ref["eager_ms"]
                ref_e, ref_g = f"{ref['eager_ms']:.2f} ms", f"{ref['graph_ms']:.2f} ms" if ref["graph_ms"] else "-"
                ratio = f"{r['p50 latency'] / 1e3 / best:.2f}x lat"
            else:
                best = ref["graph_ips"] or ref["eager_ips"]
                ref_e, ref_g = f"{ref['eager_ips']:.0f}/s", f"{ref['graph_ips']:.0f}/s" if ref["graph_ips"] else "-"
                ratio = f"{r['Inferences/Second'] / best:.2f}"
            print(f"{m['label']:<20} {mode:<7} {batch:>5} {conc:>4} {r['Inferences/Second']:>9.0f} "
                  f"{r['p50 latency'] / 1e3:>7.2f} {r['p99 latency'] / 1e3:>7.2f} {r['Avg latency'] / 1e3:>7.2f} "
                  f"{r['Server Compute Infer'] / 1e3:>8.2f} {ref_e:>10} {ref_g:>10} {ratio:>11}{note}", flush=True)
            if a.timing:
                print(f"    backend timing (mean): {timing.since_last()}")

        # offline: whole batches, concurrency 1
        for m in models:
            for batch in m["batches"]:
                shms = ["system"] + ["cuda"] * (a.cuda_shm and batch == m["mb"])
                for shm in shms:
                    for mode in served_modes[m["base"]]:
                        for protocol in a.protocol:
                            r = perf(a.perf_analyzer, a.port, f"{m['base']}_{mode}", batch, 1, out_dir,
                                     [*m["pa_extra"], "--max-trials", "15"], shm, must=False, protocol=protocol)
                            if r is None:
                                continue
                            show(m, mode, batch, 1, r, refs[m["base"]]["bare"][batch],
                                 (" (CUDA shared memory)" if shm == "cuda" else "") + (" (HTTP)" if protocol == "http" else ""))
        # online: requests of batch 1, dynamic batching, against the bare engine at batch 64
        # (or the model's largest batch below it)
        for m in models:
            if not m["online"]:
                continue
            ref_b = m["online_ref"]
            ref = refs[m["base"]]["bare"][ref_b]
            plain = [("graphs", [max(a.concurrency)])] if "graphs" in m["modes"] else []
            for mode, concs in (*plain, ("online", a.concurrency)):
                for conc in concs:
                    # online load does not always settle within perf_analyzer's trials; a
                    # missing figure is reported, not fatal
                    r = perf(a.perf_analyzer, a.port, f"{m['base']}_{mode}", 1, conc, out_dir,
                             [*m["pa_extra"], "--max-trials", "20"], must=False, protocol=a.protocol[0])
                    if r is not None:
                        show(m, mode, 1, conc, r, ref, f" (vs bare, batch {ref_b})")
    print("\nserver log lines about CUDA graphs:")
    with open("/tmp/dense_perf_server.log") as f:
        for line in f:
            if "CUDA graph" in line:
                print("  " + line.strip()[:200])


if __name__ == "__main__":
    main()
