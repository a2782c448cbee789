#!/usr/bin/env python3
"""All six models on the GPU through the real tritonserver and libtriton_rust.so
(issue: libtorch engine, FastPitch, and all six models on the GPU). Needs an NVIDIA GPU
and that machine's torch; run through bench/gpu/run.sh models.

Generates the models with this machine's torch (random weights, fixed seeds; the
architectures of examples/torch_models.py and examples/recommenders.py), serves them as
TorchScript on KIND_GPU instances — the recommenders as ensembles whose sparse step is
the embedding store with its GPU cache — compares every output with torch eager on the
same GPU, and prints: model, precision, max abs diff, throughput at one batch size
through the server, the same model run bare in torch, and their ratio."""
import argparse
import os
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import cuda_shm  # noqa: E402
import export_models  # noqa: E402
import recommenders  # noqa: E402
import torch_models  # noqa: E402
from kserve_client import Client  # noqa: E402
from tritonserver_process import serve  # noqa: E402

TOL = {"fp32": 1e-3, "fp16": 5e-2,  # stated tolerances: |server - reference| per element
       # ONNX Runtime's CUDA provider (against ONNX Runtime on the CPU, or torch eager for the
       # recommenders' dense steps): TF32 in its convolutions and matmuls by default
       "onnx fp32": 1e-2, "onnx fp16": 5e-2}


class Half(torch.nn.Module):
    """Runs a module in fp16 behind fp32 (or integer) inputs and outputs."""

    def __init__(self, m):
        super().__init__()
        self.m = m.half()

    def forward(self, x):
        return self.m(x.half()).float()


class HalfDense(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m.half()

    def forward(self, dense, embeddings):
        return self.m(dense.half(), embeddings.half()).float()


class HalfBert(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m.half()

    def forward(self, ids, seg, mask):
        s, e = self.m(ids, seg, mask)
        return s.float(), e.float()


class HalfFastPitch(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m.half()

    def forward(self, ids):
        mel, n, d, p = self.m(ids)
        return mel.float(), n, d.float(), p.float()


def tensor_cfg(name, dtype, dims):
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(str(d) for d in dims)} ] }}'


GPUS = "0"  # set from --gpus: the instance groups' device list


def torch_config(name, max_batch, inputs, outputs, batching=True, count=1):
    return f"""name: "{name}"
backend: "rust"
max_batch_size: {max_batch}
input [ {", ".join(inputs)} ]
output [ {", ".join(outputs)} ]
{"dynamic_batching { max_queue_delay_microseconds: 100 }" if batching else ""}
instance_group [ {{ count: {count} kind: KIND_GPU gpus: [ {GPUS} ] }} ]
parameters {{ key: "engine" value {{ string_value: "torch" }} }}
"""


def onnx_config(name, max_batch, inputs, outputs):
    return torch_config(name, max_batch, inputs, outputs).replace('string_value: "torch"', 'string_value: "onnx"')


def ensemble_config(name, batch, sparse, dense):
    """A recommender as Triton's ensemble: the embedding store's step, then the dense step."""
    return f"""name: "{name}"
platform: "ensemble"
max_batch_size: {batch}
input [ {tensor_cfg("dense", "TYPE_FP32", [13])}, {tensor_cfg("sparse", "TYPE_INT64", [26])} ]
output [ {tensor_cfg("prediction", "TYPE_FP32", [1])} ]
ensemble_scheduling {{ step [
  {{ model_name: "{sparse}" model_version: -1 input_map {{ key: "KEYS" value: "sparse" }} output_map {{ key: "OUTPUT0" value: "embeddings" }} }},
  {{ model_name: "{dense}" model_version: -1 input_map {{ key: "dense" value: "dense" }} input_map {{ key: "embeddings" value: "embeddings" }} output_map {{ key: "prediction" value: "prediction" }} }}
] }}
"""


def write(repo, name, config, module=None):
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config)
    if module is not None:
        torch.jit.script(module).save(os.path.join(repo, name, "1", "model.pt"))


def bare_rate(fn, batch, seconds=3.0):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        fn()
        n += 1
    torch.cuda.synchronize()
    return n * batch / (time.time() - t0)


def server_rate(client, model, feeds, outputs, batch, seconds=3.0):
    for _ in range(2):
        client.infer(model, feeds, outputs)
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        client.infer(model, feeds, outputs)
        n += 1
    return n * batch / (time.time() - t0)


def concurrent_check(port, ensemble, feeds, eager, threads=8, per_thread=6, rows=512):
    """Concurrent ensemble requests: the dense step's dynamic batcher merges requests whose
    embeddings are in GPU memory (gathered on the GPU); every answer must stay exact."""
    import threading
    dense_model = ensemble.replace("_fp", "_dense_fp").replace("_onnx", "_dense_onnx")
    with torch.no_grad():
        ref = eager()[0].float().cpu().numpy()
    c = Client(f"localhost:{port}")
    before = c.stats(dense_model)
    worst = [0.0]
    def work(i):
        cl = Client(f"localhost:{port}")
        for j in range(per_thread):
            lo = ((i * per_thread + j) * rows) % (len(ref) - rows)
            part = {k: v[lo:lo + rows] for k, v in feeds.items()}
            got = cl.infer(ensemble, part, ["prediction"])["prediction"]
            worst[0] = max(worst[0], float(np.abs(got - ref[lo:lo + rows]).max()))
        cl.close()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    after = c.stats(dense_model)
    c.close()
    print(f"    concurrent: {threads * per_thread} requests of {rows} -> {dense_model} ran "
          f"{after['execution_count'] - before['execution_count']} executions for "
          f"{after['inference_count'] - before['inference_count']} rows; max abs diff {worst[0]:.3e}")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--libtorch-dir", default=os.path.join(os.path.dirname(torch.__file__), "lib"))
    p.add_argument("--work", default="/tmp/all_models")
    p.add_argument("--rows", type=int, default=100_000, help="rows per recommender table")
    p.add_argument("--port", type=int, default=18600)
    p.add_argument("--gpus", default="0", help="device ids of every instance group, e.g. 0,1 (count instances on each)")
    p.add_argument("--quick", action="store_true", help="correctness only: skip the throughput figures (e.g. to build the repository for soak.py)")
    p.add_argument("--only", default="", help="comma-separated subset: resnet50,bert,fastpitch,dlrm,dcnv2,wide_deep")
    p.add_argument("--ort-lib", default="", help="onnxruntime-gpu's libonnxruntime.so: also serve the ONNX models of "
                   "examples/ (ResNet50 and BERT-large, FP32 and FP16, against ONNX Runtime on the CPU; the "
                   "recommenders' ensembles with their ONNX dense step) on KIND_GPU")
    p.add_argument("--inputs-on-gpu", type=int, default=-1,
                   help="send each checked request's inputs, and take its outputs, through CUDA shared memory on this "
                        "GPU (with --gpus naming another: the instances take them from a peer's memory); default: in "
                        "the request's body")
    a = p.parse_args()
    global GPUS
    GPUS = ", ".join(a.gpus.split(","))
    only = set(filter(None, a.only.split(",")))
    want = lambda m: not only or m in only  # noqa: E731
    dev = torch.device("cuda:0")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print(f"GPU: {smi}")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    repo = os.path.join(a.work, "repo")
    os.makedirs(repo, exist_ok=True)
    # eager keeps libtorch's defaults (TF32 allowed in cuDNN convolutions, not in matmuls),
    # the same the server's libtorch runs with

    cases = []  # (label, precision, model name, feeds, outputs, reference fn, batch)
    t0 = time.time()
    # ResNet50
    rn = torch_models.make("resnet50_pt").to(dev)
    x = np.random.default_rng(0).standard_normal((64, 3, 224, 224)).astype(np.float32)
    for prec, mod, dt in [("fp32", rn, "TYPE_FP32"), ("fp16", Half(torch_models.make("resnet50_pt")).to(dev), "TYPE_FP32")] * want("resnet50"):
        name = f"resnet50_{prec}"
        # two instances on the GPU, each with its own CUDA stream
        write(repo, name, torch_config(name, 128, [tensor_cfg("INPUT__0", dt, [3, 224, 224])],
                                       [tensor_cfg("OUTPUT__0", "TYPE_FP32", [1000])], count=2), mod)
        cases.append(("ResNet50", prec, name, {"INPUT__0": x}, ["OUTPUT__0"],
                      (lambda m: lambda: [m(torch.from_numpy(x).to(dev))])(mod), 64))
    # BERT-large QA
    bert = torch_models.make("bert_large_pt").to(dev) if want("bert") else None
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 30522, (8, 384)).astype(np.int32)
    seg = np.zeros((8, 384), np.int32)
    seg[:, 192:] = 1
    mask = np.ones((8, 384), np.int32)
    mask[:, 320:] = 0
    for prec, mod in [("fp32", bert), ("fp16", HalfBert(torch_models.make("bert_large_pt")).to(dev))] * want("bert"):
        name = f"bert_large_{prec}"
        write(repo, name, torch_config(name, 16, [tensor_cfg(f"input__{i}", "TYPE_INT32", [384]) for i in range(3)],
                                       [tensor_cfg(f"output__{i}", "TYPE_FP32", [384]) for i in range(2)]), mod)
        cases.append(("BERT-large QA", prec, name, {"input__0": ids, "input__1": seg, "input__2": mask},
                      ["output__0", "output__1"],
                      (lambda m: lambda: list(m(*[torch.from_numpy(v).to(dev) for v in (ids, seg, mask)])))(mod), 8))
    # FastPitch
    fp_ids = torch_models.fastpitch_inputs(8, seed=3).numpy()
    for prec, mod in [("fp32", torch_models.make("fastpitch").to(dev)),
                      ("fp16", HalfFastPitch(torch_models.make("fastpitch")).to(dev))] * want("fastpitch"):
        name = f"fastpitch_{prec}"
        write(repo, name, torch_config(name, 8, [tensor_cfg("INPUT__0", "TYPE_INT64", [128])],
                                       [tensor_cfg("OUTPUT__0", "TYPE_FP32", [80, -1]), tensor_cfg("OUTPUT__1", "TYPE_INT64", [1]),
                                        tensor_cfg("OUTPUT__2", "TYPE_FP32", [128]), tensor_cfg("OUTPUT__3", "TYPE_FP32", [128])]), mod)
        cases.append(("FastPitch", prec, name, {"INPUT__0": fp_ids}, ["OUTPUT__0", "OUTPUT__1", "OUTPUT__2", "OUTPUT__3"],
                      (lambda m: lambda: list(m(torch.from_numpy(fp_ids).to(dev))))(mod), 8))
    # Recommenders: sparse step = embedding store on the GPU, dense step = TorchScript on the GPU
    batch = 4096
    tables = [f"t{i}" for i in range(26)]
    for rname in [r for r in ("dlrm", "dcnv2", "wide_deep") if want(r)]:
        model = recommenders.make(rname, [a.rows] * 26)
        dim = model.dim
        sparse = f"{rname}_sparse"
        tdir = os.path.join(repo, sparse, "1", "tables")
        for i, e in enumerate(model.embeddings):
            d = os.path.join(tdir, f"t{i}")
            os.makedirs(d, exist_ok=True)
            np.save(os.path.join(d, "keys.npy"), np.arange(a.rows, dtype=np.int64))
            np.save(os.path.join(d, "vectors.npy"), e.weight.detach().numpy().astype(np.float32))
        write(repo, sparse, f"""name: "{sparse}"
backend: "rust"
max_batch_size: {batch}
input [ {tensor_cfg("KEYS", "TYPE_INT64", [26])} ]
output [ {tensor_cfg("OUTPUT0", "TYPE_FP32", [26, dim])} ]
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
instance_group [ {{ count: 1 kind: KIND_GPU gpus: [ {GPUS} ] }} ]
parameters {{ key: "engine" value {{ string_value: "embedding" }} }}
parameters {{ key: "embedding_interface" value {{ string_value: "batched" }} }}
parameters {{ key: "embedding_table_names" value {{ string_value: "{','.join(tables)}" }} }}
parameters {{ key: "embedding_vecsize_per_table" value {{ string_value: "{dim}" }} }}
parameters {{ key: "gpucacheper" value {{ string_value: "0.5" }} }}
""")
        dense_in = [tensor_cfg("dense", "TYPE_FP32", [13]), tensor_cfg("embeddings", "TYPE_FP32", [26, dim])]
        if a.ort_lib:
            # the same dense part as ONNX (examples/recommenders.py), run by ONNX Runtime on
            # the GPU behind the same sparse step: the embeddings reach it in GPU memory
            dname = f"{rname}_dense_onnx"
            write(repo, dname, onnx_config(dname, batch, dense_in, [tensor_cfg("prediction", "TYPE_FP32", [1])]))
            export_models.save_model(recommenders.dense_onnx(rname, model.eval()), os.path.join(repo, dname, "1", "model.onnx"))
        model = model.to(dev).eval()
        rng = np.random.default_rng(5)
        dense = rng.standard_normal((batch, 13)).astype(np.float32)
        keys = rng.integers(0, a.rows, (batch, 26)).astype(np.int64)
        for prec in ("fp32", "fp16"):
            dense_mod = recommenders.DensePart(model) if prec == "fp32" else HalfDense(recommenders.DensePart(recommenders.make(rname, [a.rows] * 26))).to(dev)
            dname = f"{rname}_dense_{prec}"
            write(repo, dname, torch_config(dname, batch, dense_in, [tensor_cfg("prediction", "TYPE_FP32", [1])]), dense_mod)
            ens = f"{rname}_{prec}"
            write(repo, ens, ensemble_config(ens, batch, sparse, dname))
            os.makedirs(os.path.join(repo, ens, "1"), exist_ok=True)
            eager = (lambda m, dm: lambda: [dm(torch.from_numpy(dense).to(dev), m.lookup(torch.from_numpy(keys).to(dev)))])(model, dense_mod)
            label = {"dlrm": "DLRM", "dcnv2": "DCNv2", "wide_deep": "Wide&Deep"}[rname]
            cases.append((label, prec, ens, {"dense": dense, "sparse": keys}, ["prediction"], eager, batch))
        if a.ort_lib:
            ens = f"{rname}_onnx"
            write(repo, ens, ensemble_config(ens, batch, sparse, f"{rname}_dense_onnx"))
            os.makedirs(os.path.join(repo, ens, "1"), exist_ok=True)
            eager = (lambda m: lambda: [recommenders.DensePart(m)(torch.from_numpy(dense).to(dev), m.lookup(torch.from_numpy(keys).to(dev)))])(model)
            cases.append((label + " ONNX", "onnx fp32", ens, {"dense": dense, "sparse": keys}, ["prediction"], eager, batch))
    if a.ort_lib:
        # ResNet50 and BERT-large as examples/export_models.py builds them, FP32 and FP16,
        # against ONNX Runtime on the CPU running the same file
        for base, want_m, feeds, outs, ins, outs_cfg, b in (
            ("resnet50", "resnet50", {"INPUT__0": x[:16]}, ["OUTPUT__0"], None, None, 16),
            ("bert_large", "bert", {"input__0": ids, "input__1": seg, "input__2": mask}, ["output__0", "output__1"], None, None, 8),
        ):
            if not want(want_m):
                continue
            for prec in ("fp32", "fp16"):
                name = f"{base}_onnx_{prec}"
                path = os.path.join(repo, name, "1", "model.onnx")
                export_models.build_model(base if prec == "fp32" else f"{base}_fp16", path)
                f = {k: (v.astype(np.float16) if prec == "fp16" and v.dtype == np.float32 else v) for k, v in feeds.items()}
                ft = "TYPE_FP16" if prec == "fp16" else "TYPE_FP32"
                if base == "resnet50":
                    cfg = onnx_config(name, 128, [tensor_cfg("INPUT__0", ft, [3, 224, 224])], [tensor_cfg("OUTPUT__0", ft, [1000])])
                else:
                    cfg = onnx_config(name, 16, [tensor_cfg(f"input__{i}", "TYPE_INT32", [384]) for i in range(3)],
                                      [tensor_cfg(f"output__{i}", ft, [384]) for i in range(2)])
                write(repo, name, cfg)
                cpu = (lambda p, f: lambda: [torch.from_numpy(v) for v in export_models.run_onnxruntime(p, f).values()])(path, f)
                cases.append((f"{'ResNet50' if base == 'resnet50' else 'BERT-large QA'} ONNX", f"onnx {prec}", name, f, outs, cpu, b))
    print(f"models generated in {time.time() - t0:.0f} s")

    log_path = os.path.join(a.work, "server.log")
    rows, failures = [], []
    with serve(a.server, repo, a.backends, a.port, log_path,
               extra=[f"--backend-config=rust,libtorch-dir={a.libtorch_dir}"]
               + ([f"--backend-config=rust,onnxruntime-library={a.ort_lib}"] if a.ort_lib else [])) as c:
        print(f"server ready after loading {len(cases)} models ({time.time() - t0:.0f} s)")
        for label, prec, name, feeds, outputs, eager, b in cases:
            with torch.no_grad():
                got = c.infer(name, feeds, outputs)
                if a.inputs_on_gpu >= 0:
                    # the same request with its inputs and outputs in another GPU's memory,
                    # against the answer in the body just after it (a TorchScript model's
                    # first runs profile, and FastPitch fp16's length can move by a frame)
                    shm = cuda_shm.infer_through(c, name, feeds, outputs, a.inputs_on_gpu, got)
                    body = c.infer(name, feeds, outputs)
                    same = all(shm[o].shape == body[o].shape and np.array_equal(shm[o], body[o]) for o in outputs)
                    print(f"  {label:<14} {prec}  inputs and outputs in CUDA shared memory on GPU {a.inputs_on_gpu}: "
                          f"{'the same bits as' if same else 'DIFFERENT from'} the answer in the body", flush=True)
                    if not same:
                        failures.append(f"{name}: answer through GPU {a.inputs_on_gpu}'s memory differs")
                ref = [r.float().cpu().numpy() if r.is_floating_point() else r.cpu().numpy() for r in eager()]
                diff = max(float(np.abs(got[o].astype(np.float64) - ref[i].astype(np.float64)).max()) for i, o in enumerate(outputs))
                srv = float("nan") if a.quick else server_rate(c, name, feeds, outputs, b)
                # (an ONNX model's reference is ONNX Runtime on the CPU: no bare GPU figure)
                cpu_ref = prec.startswith("onnx") and not name.endswith("_onnx")
                bare = float("nan") if a.quick or cpu_ref else bare_rate(eager, b)
            rows.append((label, prec, diff, b, srv, bare))
            if name.startswith(("dlrm", "dcnv2", "wide_deep")) and not a.quick:
                concurrent_check(a.port, name, feeds, eager)
            ok = "ok" if diff <= TOL[prec] else "OVER TOLERANCE"
            print(f"  {label:<14} {prec}  max abs diff {diff:.3e} ({ok})  batch {b}: server {srv:,.0f}/s, bare torch {bare:,.0f}/s")
    print()
    print(f"{'model':<14} {'precision':<9} {'max abs diff':>12} {'tolerance':>9} {'batch':>6} {'server items/s':>15} {'bare torch items/s':>18} {'ratio':>6}")
    for label, prec, diff, b, srv, bare in rows:
        print(f"{label:<14} {prec:<9} {diff:>12.3e} {TOL[prec]:>9.0e} {b:>6} {srv:>15,.0f} {bare:>18,.0f} {srv / bare:>6.2f}")
    if a.inputs_on_gpu >= 0:
        print(f"\nevery checked request was sent again with its inputs and outputs in CUDA shared memory on GPU "
              f"{a.inputs_on_gpu}; the instances are on GPU(s) {GPUS}: "
              f"{'; '.join(failures) if failures else 'every answer the same bits as in the body'}")
    placed = [l.strip() for l in open(log_path) if "ready on Gpu" in l]
    print("\ninstances and their devices (server log):")
    for l in placed:
        print("  " + l[l.find("instance '"):][:120])
    gpu_lines = [l.strip() for l in open(log_path) if "arrived in GPU memory" in l]
    print("\nmemory the dense steps received their embeddings in (server log):")
    for l in gpu_lines[:6] or ["  (no input arrived in GPU memory)"]:
        print("  " + l[-200:])
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
