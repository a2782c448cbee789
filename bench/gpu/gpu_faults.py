#!/usr/bin/env python3
"""GPU faults through the real tritonserver (issue 10): what the server answers, and
whether a healthy model on the same GPU still answers correctly afterwards.

1. Too large for the GPU: BERT-large (TorchScript, fp32, ~1.3 GB) with 80 instances on
   one GPU. The load must fail cleanly; ResNet50 and a guarded BERT keep serving.
2. Ids past BERT's vocabulary to a model with `valid_range`: refused before the GPU
   (INVALID_ARG naming the input and the element); the GPU stays healthy.
3. The same ids to a model without `valid_range`: a CUDA device-side assert. CUDA keeps
   that error for the whole process's context on the GPU; the server must say so
   clearly for every model on that GPU rather than fail in confusing ways.

    python3 bench/gpu/gpu_faults.py --server $PYT/pytriton/tritonserver/bin/tritonserver --backends /tmp/rust_backends
"""
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
import torch_models  # noqa: E402
from kserve_client import InferError  # noqa: E402
from tritonserver_process import post, serve  # noqa: E402

VOCAB = 30522


def gpu_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return float(out.split()[0])


def config(name, count, valid_range=None):
    ins = ", ".join(f'{{ name: "input__{i}" data_type: TYPE_INT32 dims: [ 384 ] }}' for i in range(3))
    outs = ", ".join(f'{{ name: "output__{i}" data_type: TYPE_FP32 dims: [ 384 ] }}' for i in range(2))
    text = (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: 8\ninput [ {ins} ]\noutput [ {outs} ]\n'
            f'instance_group [ {{ count: {count} kind: KIND_GPU gpus: [ 0 ] }} ]\n'
            'parameters { key: "engine" value { string_value: "torch" } }\n')
    if valid_range:
        text += f'parameters {{ key: "valid_range" value {{ string_value: "{valid_range}" }} }}\n'
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--work", default="/tmp/gpu_faults")
    p.add_argument("--port", type=int, default=18900)
    p.add_argument("--instances", type=int, default=80, help="BERT-large instances for the too-large case")
    a = p.parse_args()
    dev = torch.device("cuda:0")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    print(f"GPU: {smi}")
    repo = os.path.join(a.work, "repo")
    os.makedirs(repo, exist_ok=True)
    # models: one BERT-large file shared by three configs, and ResNet50
    bert_file = os.path.join(a.work, "bert_large.pt")
    if not os.path.exists(bert_file):
        torch.jit.script(torch_models.make("bert_large_pt").eval()).save(bert_file)
    for name, count, rng in (("bert_guarded", 1, f"input__0:0:{VOCAB - 1},input__1:0:1,input__2:0:1"),
                             ("bert_raw", 1, None), ("bert_many", a.instances, None)):
        os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(config(name, count, rng))
        link = os.path.join(repo, name, "1", "model.pt")
        if not os.path.exists(link):
            os.symlink(bert_file, link)
    rn = torch_models.make("resnet50_pt").eval()
    os.makedirs(os.path.join(repo, "resnet50", "1"), exist_ok=True)
    torch.jit.script(rn).save(os.path.join(repo, "resnet50", "1", "model.pt"))
    with open(os.path.join(repo, "resnet50", "config.pbtxt"), "w") as f:
        f.write('name: "resnet50"\nbackend: "rust"\nmax_batch_size: 8\n'
                'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]\n'
                'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]\n'
                'instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]\n'
                'parameters { key: "engine" value { string_value: "torch" } }\n')
    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        ref = rn.to(dev)(torch.from_numpy(x).to(dev)).cpu().numpy()
    rn.cpu()
    del rn
    torch.cuda.empty_cache()
    ids = np.random.default_rng(1).integers(1, VOCAB, (1, 384)).astype(np.int32)
    seg, mask = np.zeros((1, 384), np.int32), np.ones((1, 384), np.int32)
    feeds = lambda ids: {"input__0": ids, "input__1": seg, "input__2": mask}  # noqa: E731
    bad_ids = ids.copy()
    bad_ids[0, 17] = VOCAB + 9000

    libtorch = os.path.join(os.path.dirname(torch.__file__), "lib")
    extra = ["--model-control-mode=explicit", "--load-model=resnet50", "--load-model=bert_guarded",
             f"--backend-config=rust,libtorch-dir={libtorch}"]
    with serve(a.server, repo, a.backends, a.port, "/tmp/gpu_faults.log", extra=extra, timeout=900) as c:
        def healthy(when):
            got = c.infer("resnet50", {"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
            diff = float(np.abs(got - ref).max())
            b = c.infer("bert_guarded", feeds(ids), ["output__0"])["output__0"]
            ok = diff < 1e-3 and np.isfinite(b).all()
            print(f"  {when}: resnet50 max abs diff vs torch eager {diff:.2e}, bert_guarded answered {b.shape} -> "
                  f"{'healthy' if ok else 'WRONG'}")
            return ok

        def answer(model, f, outs):
            try:
                c.infer(model, f, outs)
                return "answered (no error)"
            except InferError as e:
                return f"HTTP {e.status}: {e.message[:240]}"

        print("== baseline")
        healthy("before any fault")
        used = gpu_used_mib()

        print(f"== 1. too large: bert_many with {a.instances} BERT-large instances on one GPU")
        t0 = time.time()
        status, body = post(a.port, "/v2/repository/models/bert_many/load")
        print(f"  load answered HTTP {status} after {time.time() - t0:.0f} s: {body[:300]}")
        time.sleep(3)
        print(f"  GPU memory used: {used:.0f} MiB before the load, {gpu_used_mib():.0f} MiB after it failed")
        healthy("after the failed load")

        print("== 2. ids past the vocabulary to bert_guarded (valid_range)")
        print(f"  bert_guarded: {answer('bert_guarded', feeds(bad_ids), ['output__0'])}")
        healthy("after the refused request")

        print("== 3. the same ids to bert_raw (no valid_range): a device-side assert")
        status, body = post(a.port, "/v2/repository/models/bert_raw/load")
        print(f"  bert_raw loaded: HTTP {status}")
        print(f"  bert_raw, good ids: {answer('bert_raw', feeds(ids), ['output__0'])}")
        print(f"  bert_raw, bad ids: {answer('bert_raw', feeds(bad_ids), ['output__0'])}")
        time.sleep(1)
        print(f"  resnet50 afterwards: {answer('resnet50', {'INPUT__0': x}, ['OUTPUT__0'])}")
        print(f"  bert_guarded afterwards: {answer('bert_guarded', feeds(ids), ['output__0'])}")
        print(f"  bert_raw afterwards: {answer('bert_raw', feeds(ids), ['output__0'])}")
        log = open("/tmp/gpu_faults.log", errors="replace").read()
        for line in log.splitlines():
            if "unrecoverable CUDA error" in line:
                print(f"  server log: {line.strip()[:300]}")
                break


if __name__ == "__main__":
    main()
