#!/usr/bin/env python3
"""AOTInductor packages served on a GPU, checked rather than timed (run.sh aoti-check).

FastPitch (FP32; no CUDA graph: its frame count is read on the host), ResNet50 and BERT-large
QA (FP16, a CUDA graph per batch bucket), each exported as a CUDA package in this run
(examples/aoti_export.py) and served on a KIND_GPU instance of GPU 0 (`--gpu`):

- answers: requests of batch 1, 3 and the largest, equal to torch eager on the same GPU
  (FastPitch: the TorchScript twin's module; the others: the module that was exported) within
  the tolerance (FastPitch on a GPU relative to each output's scale, and an item whose frame
  count differs passes only where the durations that round apart lie at .5 within it:
  `compare_fastpitch`), with the outputs returned in the body and, again, written by the server into
  CUDA shared memory (the path where the plugin's outputs are copied on the backend's stream:
  BERT's logits and FastPitch's mel are strided views in the package);
- bad input: a symbol id past FastPitch's table and a token id past BERT's vocabulary are
  refused naming the input, and the model answers the next request;
- FastPitch again with CUDA graphs asked for (`fastpitch_aoti_graphs`, the same package): its
  runs cannot be captured, and each falls back to a plain run with the same answers;
- sizes past the export: docs/pytorch2.md's TinyBert (position table of 512), exported in plain
  torch with a sequence `Dim` of 8..128 and no metadata of ours, served beside the others on the
  same GPU; sequences of 600 and 4096 tokens are refused with a 400 naming the input and the
  dimension (the compiled code would index past the position table: a device-side assertion
  that poisons the GPU's context), and then every model on that GPU still answers equal to eager;
- with `--gpu G --inputs-on-gpu M` (two GPUs): the instances on GPU G, and every case sent
  again with its inputs and outputs in CUDA shared memory on GPU M, equal to the body's answer
  bit for bit (the backend moves them between GPUs);
- the server log: each package's CUDA module loads tracked (crates/aoti/src/modules.cpp), no
  module that failed to unload.

`--device cpu` runs the same on the CPU (CPU packages, KIND_CPU, small BERT, no shared memory,
no module lines): how the script itself is checked on a machine without a GPU.

    python3 bench/gpu/aoti_check.py --server $TRITONSERVER --backends install/backends [--device cpu]
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import aoti_export  # noqa: E402
import cuda_shm  # noqa: E402
import torch_models  # noqa: E402
from kserve_client import InferError  # noqa: E402
from tritonserver_process import serve  # noqa: E402

TOL = {"fp16": 5e-2, "fp32 cuda": 1e-3, "fp32 cpu": 2e-5}
GPU = 0  # the instances' GPU (--gpu)


def models(device):
    """name -> (module, example inputs (torch), max batch, half, graph buckets, bad input or None,
    reference module or None: the exported one)."""
    gpu = device == "cuda"
    bert = "bert_large_aoti" if gpu else "bert_small_aoti"
    out = {
        "fastpitch_aoti": (*aoti_export.EXAMPLES["fastpitch_aoti"](), False, (),
                           ("INPUT__0", 148), torch_models.make("fastpitch")),
        "resnet50_aoti": (torch_models.make("resnet50_pt"), (torch.randn(2, 3, 224, 224),), 32 if gpu else 8,
                          gpu, (1, 2, 4, 8, 16, 32) if gpu else (), None, None),
        bert: (*aoti_export.EXAMPLES[bert](), gpu, (1, 2, 4, 8, 16) if gpu else (), ("INPUT__0", 30522), None),
    }
    return out


class TinyBert(torch.nn.Module):
    """docs/pytorch2.md's recipe model: token and position embeddings, a head."""

    def __init__(self, vocab=1000, positions=512, hidden=32):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, hidden)
        self.positions = torch.nn.Embedding(positions, hidden)
        self.head = torch.nn.Linear(hidden, 2)

    def forward(self, input_ids):
        where = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.head(torch.tanh(self.tokens(input_ids) + self.positions(where)))


RANGE_MODEL = "tiny_bert_range"


def export_range_model(repo, dev):
    """The recipe's package for `dev` (plain torch.export, a sequence Dim of 8..128, no metadata)
    and its config (inputs listed); returns the eager module."""
    torch.manual_seed(0)
    module = TinyBert().eval().to(dev)
    batch = torch.export.Dim("batch", min=1, max=8)
    seq = torch.export.Dim("seq", min=8, max=128)
    with torch.no_grad():
        ep = torch.export.export(module, (torch.randint(0, 1000, (4, 32), device=dev),),
                                 dynamic_shapes=({0: batch, 1: seq},))
        os.makedirs(os.path.join(repo, RANGE_MODEL, "1"), exist_ok=True)
        torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(repo, RANGE_MODEL, "1", "model.pt2"))
    group = f"KIND_GPU gpus: [ {GPU} ]" if dev == "cuda" else "KIND_CPU"
    with open(os.path.join(repo, RANGE_MODEL, "config.pbtxt"), "w") as f:
        f.write(f'name: "{RANGE_MODEL}"\nbackend: "rust"\nplatform: "torch_aoti"\nmax_batch_size: 8\n'
                'input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ -1 ] } ]\n'
                'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]\n'
                f'dynamic_batching {{ }}\ninstance_group [ {{ count: 1 kind: {group} }} ]\n')
    return module


def check_range_model(client, module, dev, plan, tol_of):
    """Sequences past the export refused with a 400; then every model still answers. Returns
    the failures."""
    failures = []
    ids = np.random.default_rng(5).integers(0, 1000, (2, 40)).astype(np.int64)
    want = eager(module, {"INPUT__0": ids}, dev)[0]
    d = compare(client.infer(RANGE_MODEL, {"INPUT__0": ids}, ["OUTPUT__0"])["OUTPUT__0"], want)
    print(f"{RANGE_MODEL} (sequence Dim 8..128) 2 x 40 tokens: max |served - eager| {d:.2e}", flush=True)
    if d > TOL[f"fp32 {dev}"]:
        failures.append(f"{RANGE_MODEL}: {d:.2e}")
    for length in (600, 4096):
        try:
            client.infer(RANGE_MODEL, {"INPUT__0": np.zeros((1, length), np.int64)}, ["OUTPUT__0"])
            msg, ok = "answered", False
        except InferError as e:
            msg = str(e)
            ok = e.status == 400 and f"input 'INPUT__0' has size {length} in dimension 1" in msg
        print(f"{RANGE_MODEL}, a sequence of {length}: {msg}" + ("" if ok else "  FAIL"), flush=True)
        if not ok:
            failures.append(f"{RANGE_MODEL}: a sequence of {length} not refused cleanly")
    # every model on that GPU goes on answering
    for name, (cases, tol, _) in plan.items():
        b, inputs, want = cases[0]
        outputs = [f"OUTPUT__{i}" for i in range(len(want))]
        try:
            got = client.infer(name, inputs, outputs)
            d = compare(got[outputs[0]], want[0]) if not name.startswith("fastpitch") else \
                compare_fastpitch([got[o] for o in outputs], want, tol)[0]
            ok = d <= tol
            msg = f"max |served - eager| {d:.2e}"
        except InferError as e:
            ok, msg = False, str(e)
        print(f"after the refusals, {name} batch {b}: {msg}" + ("" if ok else "  FAIL"), flush=True)
        if not ok:
            failures.append(f"{name} after the refusals: {msg}")
    return failures


def config(name, max_batch, device, buckets):
    group = f"KIND_GPU gpus: [ {GPU} ]" if device == "cuda" else "KIND_CPU"
    text = (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: {max_batch}\n'
            f'dynamic_batching {{ max_queue_delay_microseconds: 1000 }}\n'
            f'instance_group [ {{ count: 1 kind: {group} }} ]\n'
            f'parameters {{ key: "engine" value {{ string_value: "aoti" }} }}\n')
    if buckets:
        spec = ", ".join(f"{{ batch_size: {b} }}" for b in buckets)
        text += f"optimization {{ cuda {{ graphs: true graph_spec [ {spec} ] }} }}\n"
    return text


def feeds(name, batch, seed, half):
    """{input name: numpy array} of one request."""
    if name == "fastpitch_aoti":
        return {"INPUT__0": torch_models.fastpitch_inputs(batch, seed=seed, min_len=8, max_len=128).numpy()}
    if name.startswith("bert"):
        g = np.random.default_rng(seed)
        ids = g.integers(1, 30522, (batch, 384)).astype(np.int32)
        seg = np.zeros((batch, 384), np.int32)
        seg[:, 150:] = 1
        mask = np.ones((batch, 384), np.int32)
        mask[:, 300:] = 0
        return {"INPUT__0": ids, "INPUT__1": seg, "INPUT__2": mask}
    x = np.random.default_rng(seed).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    return {"INPUT__0": x.astype(np.float16) if half else x}


def eager(module, inputs, device):
    with torch.inference_mode():
        out = module(*[torch.from_numpy(v).to(device) for v in inputs.values()])
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o.cpu().numpy() for o in out]


def compare(got, want):
    """max |got - want| (both cut to want's shape where the served frames run longer, which
    must then be zero); inf where the shapes cannot be compared."""
    if got.shape != want.shape:
        if got.ndim != want.ndim or got.shape[:-1] != want.shape[:-1] or got.shape[-1] < want.shape[-1] \
                or np.any(got[..., want.shape[-1]:]):
            return float("inf")
        got = got[..., :want.shape[-1]]
    if want.size == 0:
        return 0.0
    return float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())


def compare_fastpitch(got, want, tol):
    """FastPitch's outputs (mel [B, 80, frames], mel length [B, 1], durations [B, T], pitch
    [B, T]) against eager: (the largest difference, relative to each output's largest
    magnitude where it exceeds 1, and what was not compared). Each item's frame count is its
    durations rounded: where two correct compilations disagree by a few ulps on a duration at
    .5, one frame more or less follows and that item's mel cannot be compared frame by frame.
    Such an item passes only if every duration that rounds differently lies within `tol` of .5;
    its durations and pitch are still compared."""
    mel, length, dur, pitch = (np.asarray(x) for x in got)
    w_mel, w_len, w_dur, w_pitch = (np.asarray(x) for x in want)

    def rel(a, b):
        if a.size == 0:
            return 0.0
        return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) / max(1.0, float(np.abs(b).max()))

    worst = max(rel(dur, w_dur), rel(pitch, w_pitch))
    skipped = []
    for i in range(w_mel.shape[0]):
        n, w_n = int(length[i, 0]), int(w_len[i, 0])
        if n != w_n:
            flips = np.round(dur[i]) != np.round(w_dur[i])
            at_half = np.abs(w_dur[i] - np.floor(w_dur[i]) - 0.5) <= tol
            if not flips.any() or not np.all(at_half[flips]):
                return float("inf"), skipped
            skipped.append(f"item {i}: {n} frames against {w_n}, durations {w_dur[i][flips].tolist()} rounding apart")
            continue
        worst = max(worst, rel(mel[i, :, :n], w_mel[i, :, :n]))
        if np.any(mel[i, :, n:]):
            return float("inf"), skipped
    return worst, skipped


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--libtorch-dir", default=os.path.join(os.path.dirname(torch.__file__), "lib"))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--work", default="/tmp/aoti_check")
    p.add_argument("--port", type=int, default=18700)
    p.add_argument("--only", default="", help="comma-separated model names")
    p.add_argument("--gpu", type=int, default=0, help="the GPU of the models' instances")
    p.add_argument("--inputs-on-gpu", type=int, default=-1,
                   help="also send every case with its inputs and outputs in CUDA shared memory on this GPU")
    a = p.parse_args()
    global GPU
    GPU = a.gpu
    dev = a.device
    repo = os.path.join(a.work, "repo")
    os.makedirs(repo, exist_ok=True)
    gpu_name = torch.cuda.get_device_name(0) if dev == "cuda" else "none (CPU run)"
    print(f"device: {gpu_name}; torch {torch.__version__}", flush=True)

    plan = {}
    for name, (module, example, mb, half, buckets, bad, ref) in models(dev).items():
        if a.only and name not in a.only.split(","):
            continue
        path = os.path.join(repo, name, "1", "model.pt2")
        t0 = time.time()
        with torch.no_grad():
            aoti_export.package(module, example, path, max_batch=mb, device=dev, half=half)
        print(f"{name}: {dev} package{' (fp16)' if half else ''} exported in {time.time() - t0:.0f} s", flush=True)
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(config(name, mb, dev, buckets))
        ref = (ref if ref is not None else module).eval().to(dev)
        cases = []
        for b, seed in ((1, 1), (3, 2), (mb, 3)):
            inputs = feeds(name, b, seed, half)
            cases.append((b, inputs, eager(ref, inputs, dev)))
        tol = TOL["fp16"] if half else TOL[f"fp32 {dev}"]
        plan[name] = (cases, tol, bad)
        if name == "fastpitch_aoti" and dev == "cuda":
            # the same package with CUDA graphs asked for: its runs cannot be captured (the
            # frame count is read on the host), so each bucket falls back to plain runs
            twin = "fastpitch_aoti_graphs"
            os.makedirs(os.path.join(repo, twin), exist_ok=True)
            if not os.path.exists(os.path.join(repo, twin, "1")):
                os.symlink(os.path.join(repo, name, "1"), os.path.join(repo, twin, "1"))
            with open(os.path.join(repo, twin, "config.pbtxt"), "w") as f:
                f.write(config(twin, 8, dev, (1, 2, 4, 8)))
            plan[twin] = ([c for c in cases if c[0] <= 8], tol, None)
        del module, ref
        if dev == "cuda":
            torch.cuda.empty_cache()

    range_module = None
    if not a.only or RANGE_MODEL in a.only.split(","):
        t0 = time.time()
        range_module = export_range_model(repo, dev)
        print(f"{RANGE_MODEL}: {dev} package (plain torch.export, no metadata) exported in {time.time() - t0:.0f} s",
              flush=True)

    failures = []
    log = os.path.join(a.work, "server.log")
    with serve(a.server, repo, a.backends, a.port, log,
               extra=[f"--backend-config=rust,libtorch-dir={a.libtorch_dir}"], timeout=900) as client:
        for name, (cases, tol, bad) in plan.items():
            outputs = [f"OUTPUT__{i}" for i in range(len(cases[0][2]))]
            fastpitch = name.startswith("fastpitch") and dev == "cuda"

            def differ(got, want):
                if fastpitch:
                    d, notes = compare_fastpitch(got, want, tol)
                    return d, "; ".join(notes)
                return max(compare(g, w) for g, w in zip(got, want)), ""
            what = "relative " if fastpitch else ""
            for b, inputs, want in cases:
                got = client.infer(name, inputs, outputs)
                diff, notes = differ([got[o] for o in outputs], want)
                line = (f"{name} batch {b}, outputs in the body: max {what}|served - eager| {diff:.2e} (tolerance {tol:g})"
                        + (f" [not compared frame by frame: {notes}]" if notes else ""))
                if dev == "cuda":
                    sizes = [got[o].nbytes for o in outputs]
                    with cuda_shm.Region(client, f"{name}_out_{b}", sum(sizes)) as region:
                        offsets = np.cumsum([0] + sizes[:-1]).tolist()
                        shm = {o: (region.name, off, size) for o, off, size in zip(outputs, offsets, sizes)}
                        written = client.infer(name, inputs, outputs, out_shm=shm)
                        read = cuda_shm.read_outputs(region.read((sum(sizes),), np.uint8), written,
                                                     dict(zip(outputs, offsets)))
                        diff = max(diff, differ([read[o] for o in outputs], want)[0])
                    line += f"; and written into CUDA shared memory: {diff:.2e}"
                if a.inputs_on_gpu >= 0:
                    through = cuda_shm.infer_through(client, name, inputs, outputs, a.inputs_on_gpu, got)
                    same = all(np.array_equal(through[o], got[o]) for o in outputs)
                    line += (f"; inputs and outputs in GPU {a.inputs_on_gpu}'s memory (instance on GPU {GPU}): "
                             + ("the body's answer bit for bit" if same else "DIFFERENT from the body's answer"))
                    if not same:
                        failures.append(f"{name} batch {b}: answer through GPU {a.inputs_on_gpu}'s memory differs")
                ok = diff <= tol
                print(line + ("" if ok else "  FAIL"), flush=True)
                if not ok:
                    failures.append(f"{name} batch {b}: {diff:.2e}")
            if bad:
                input_name, rows = bad
                inputs = {k: v.copy() for k, v in cases[1][1].items()}
                inputs[input_name][0, 3] = rows
                try:
                    client.infer(name, inputs, outputs)
                    msg, ok = "answered", False
                except InferError as e:
                    msg = str(e)
                    ok = e.status == 400 and input_name in msg and f"outside [0, {rows})" in msg
                after = client.infer(name, cases[0][1], outputs)
                ok = ok and compare(after[outputs[0]], cases[0][2][0]) <= tol
                print(f"{name} with {input_name}[0, 3] = {rows}: {msg}" + ("" if ok else "  FAIL"), flush=True)
                if not ok:
                    failures.append(f"{name}: bad input not refused cleanly")
        if range_module is not None:
            failures += check_range_model(client, range_module, dev, plan, None)
    with open(log, errors="replace") as f:
        text = f.read()
    said = {k: text.count(k) for k in ("CUDA module loads are tracked", "CUDA modules cannot be tracked",
                                       "CUDA modules did not unload", "no CUDA graph for input shapes")}
    print(f"server log: {said}", flush=True)
    if dev == "cuda" and (said["CUDA module loads are tracked"] < len(plan) + (range_module is not None) or said["CUDA modules did not unload"]):
        failures.append(f"module tracking: {said}")
    print("aoti_check: " + ("every check passed" if not failures else "FAILED: " + "; ".join(failures)), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
