#!/usr/bin/env python3
"""Load -> infer -> unload, many times, on KIND_GPU: does the server's memory stay flat?
(issue 10: reloads all day must not grow GPU memory or RSS).

One model kind per run (`--kind torch|onnx|aoti|embedding`): ResNet50 as TorchScript, ResNet50
as ONNX on ONNX Runtime's CUDA provider (needs `--ort-lib`, onnxruntime-gpu's library),
ResNet50 as a CUDA AOTInductor package (exported here by examples/aoti_export.py; the server's
TMPDIR is a folder of its own, and every `--every` cycles the script counts the unpacked
package folders left there and in /tmp: none may remain after an unload),
or an embedding store with a GPU cache (4 tables x 200k rows x 128). `--model fastpitch` serves
FastPitch instead of ResNet50 (TorchScript, or an AOTInductor package): its data-dependent frame
count is read on the host, so no CUDA graph can capture it. The server runs with
`--model-control-mode=explicit`; each cycle loads the model through the repository API,
checks one inference, unloads it and waits until it is gone. Every `--every` cycles it
prints the server's GPU memory (nvidia-smi, this process) and RSS, and at the end the
growth after cycle 20 (the bound: 64 MiB each; for an AOTInductor package, 64 MiB for the two
together). `--graphs` asks for CUDA graphs (`optimization { cuda { graphs: true } }`), so each
cycle also captures (ResNet50) or tries to capture and falls back (FastPitch) at its inference.

    python3 bench/gpu/reload_cycles.py --server $PYT/pytriton/tritonserver/bin/tritonserver \\
        --backends /tmp/rust_backends --kind torch --cycles 200
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from tritonserver_process import gpu_mib, post, rss_mib, serve, server_pid  # noqa: E402


def model_ready(port, model):
    try:
        with urllib.request.urlopen(f"http://localhost:{port}/v2/models/{model}/ready", timeout=10) as r:
            return r.status == 200
    except urllib.error.URLError:
        return False


def memory_map(pid):
    """RSS of the process by kind of mapping (/proc/pid/smaps), in MiB, and its thread count:
    where a growth goes (heap, anonymous mmaps such as pinned or arena memory, driver
    mappings, libraries)."""
    by = {}
    kind = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not line.startswith(("Rss:", "Size:")):
                path = head[5] if len(head) >= 6 else ""
                kind = ("heap" if path == "[heap]" else "anon" if not path else "stack" if path.startswith("[stack")
                        else "nvidia" if path.startswith("/dev/nvidia") else "shm" if path.startswith("/dev/shm")
                        else "other" if path.startswith("[") else "files")
            elif line.startswith("Rss:") and kind:
                by[kind] = by.get(kind, 0) + int(head[1]) / 1024
    by["threads"] = len(os.listdir(f"/proc/{pid}/task"))
    return by


def parameters_text(pairs):
    """Config `parameters` entries, one per (key, value)."""
    return "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in pairs)


def make_model(kind, repo, gpu, params=(), model="resnet50", graphs=False):
    """Writes the model; returns (name, feeds, output name, expected output shape; None where
    only the batch dimension is known)."""
    graphs_text = "optimization { cuda { graphs: true } }\n" if graphs else ""
    group = (f"instance_group [ {{ count: 1 kind: KIND_GPU gpus: [ {gpu} ] }} ]" if gpu != "cpu"
             else "instance_group [ { count: 1 kind: KIND_CPU } ]")
    if model == "fastpitch":
        return make_fastpitch(kind, repo, gpu, params, group + "\n" + graphs_text)
    rng = np.random.default_rng(0)
    if kind in ("torch", "onnx", "aoti"):
        name = f"resnet50_{kind}"
        os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
        if kind == "aoti":
            import time
            import torch
            import aoti_export
            import torch_models
            path = os.path.join(repo, name, "1", "model.pt2")
            if not os.path.exists(path):
                t0 = time.time()
                # a CPU package where the run is a dry run on a machine without a GPU
                device = "cpu" if gpu == "cpu" else "cuda"
                module = torch_models.make("resnet50_pt").to(device).eval()
                with torch.no_grad():
                    aoti_export.package(module, (torch.randn(2, 3, 224, 224, device=device),), path,
                                        dynamic_batch=True, max_batch=8, device=device)
                print(f"exported {path} ({os.path.getsize(path) / 1e6:.0f} MB) in {time.time() - t0:.0f} s", flush=True)
                del module
                torch.cuda.empty_cache()
            engine, inp, out = "aoti", "INPUT__0", "OUTPUT__0"
        elif kind == "torch":
            import torch
            import torch_models
            torch.jit.script(torch_models.make("resnet50_pt").eval()).save(os.path.join(repo, name, "1", "model.pt"))
            engine, inp, out = "torch", "INPUT__0", "OUTPUT__0"
        else:
            import export_models
            export_models.save_model(export_models.build_resnet50(), os.path.join(repo, name, "1", "model.onnx"))
            engine, inp, out = "onnx", "INPUT__0", "OUTPUT__0"
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(f'name: "{name}"\nbackend: "rust"\nmax_batch_size: 8\n'
                    f'input [ {{ name: "{inp}" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]\n'
                    f'output [ {{ name: "{out}" data_type: TYPE_FP32 dims: [ 1000 ] }} ]\n{group}\n{graphs_text}'
                    + parameters_text([("engine", engine), *params]))
        return name, {inp: rng.standard_normal((2, 3, 224, 224)).astype(np.float32)}, out, (2, 1000)
    name, tables, rows, dim = "store_gpu", 4, 200_000, 128
    for t in range(tables):
        d = os.path.join(repo, name, "1", "tables", f"t{t}")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "keys.npy"), np.arange(rows, dtype=np.int64))
        np.save(os.path.join(d, "vectors.npy"), rng.standard_normal((rows, dim)).astype(np.float32))
    params = dict(engine="embedding", embedding_table_names=",".join(f"t{t}" for t in range(tables)),
                  embedding_vecsize_per_table=dim, gpucacheper=0.1)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(f'name: "{name}"\nbackend: "rust"\nmax_batch_size: 0\n'
                'input [ { name: "KEYS" data_type: TYPE_INT64 dims: [ -1 ] },\n'
                '        { name: "NUMKEYS" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
                'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n' + group + "\n"
                + parameters_text(params.items()))
    keys = rng.integers(0, rows, 4096 * tables).astype(np.int64)
    return name, {"KEYS": keys, "NUMKEYS": np.full(tables, 4096, np.int32)}, "OUTPUT0", (4096 * tables * dim,)


def make_fastpitch(kind, repo, gpu, params, placement):
    """FastPitch as an AOTInductor package (its inputs and outputs auto-completed from it) or
    as TorchScript."""
    import time
    import torch
    import torch_models
    name = f"fastpitch_{kind}"
    path = os.path.join(repo, name, "1", "model.pt2" if kind == "aoti" else "model.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    device = "cpu" if gpu == "cpu" else "cuda"
    io = ""
    if kind == "torch":
        torch.jit.script(torch_models.make("fastpitch").eval()).save(path)
        io = ('input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 128 ] } ]\n'
              'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 80, -1 ] },\n'
              '         { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 1 ] },\n'
              '         { name: "OUTPUT__2" data_type: TYPE_FP32 dims: [ 128 ] },\n'
              '         { name: "OUTPUT__3" data_type: TYPE_FP32 dims: [ 128 ] } ]\n')
    elif not os.path.exists(path):
        import aoti_export
        t0 = time.time()
        module, example, _ = aoti_export.EXAMPLES["fastpitch_aoti"]()
        with torch.no_grad():
            aoti_export.package(module.to(device).eval(), example, path, max_batch=8, device=device)
        print(f"exported {path} ({os.path.getsize(path) / 1e6:.0f} MB) in {time.time() - t0:.0f} s", flush=True)
        del module
        if device == "cuda":
            torch.cuda.empty_cache()
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(f'name: "{name}"\nbackend: "rust"\nmax_batch_size: 8\n{io}{placement}'
                + parameters_text([("engine", kind), *params]))
    feeds = {"INPUT__0": torch_models.fastpitch_inputs(2, seed=1, min_len=8, max_len=64).numpy()}
    return name, feeds, "OUTPUT__0", None


def unpacked_left(dirs, before):
    """Folders in `dirs` (not in `before`) that hold an unpacked AOTInductor package."""
    found = []
    for d in dirs:
        for e in (os.listdir(d) if os.path.isdir(d) else []):
            path = os.path.join(d, e)
            if path in before or not os.path.isdir(path):
                continue
            for root, _, _ in os.walk(path):
                if "/data/aotinductor" in root:
                    found.append(path)
                    break
    return sorted(set(found))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--kind", choices=["torch", "onnx", "aoti", "embedding"], required=True)
    p.add_argument("--model", choices=["resnet50", "fastpitch"], default="resnet50",
                   help="the model of --kind aoti or torch")
    p.add_argument("--graphs", action="store_true", help="CUDA graphs asked for in the config (torch, onnx, aoti)")
    p.add_argument("--cycles", type=int, default=200)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--work", default="/tmp/reload_cycles")
    p.add_argument("--port", type=int, default=18800)
    p.add_argument("--gpu", default="0", help="device id, or cpu (a dry run of this script on a machine without one)")
    p.add_argument("--ort-lib", default="", help="libonnxruntime.so with the CUDA provider (onnx)")
    p.add_argument("--libtorch-dir", default="")
    p.add_argument("--infers", type=int, default=1, help="inferences per cycle (does a growth follow loads or runs?)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a model parameter (torch, onnx), e.g. ENABLE_TENSOR_FUSER=false; repeatable")
    a = p.parse_args()
    repo = os.path.join(a.work, a.kind)
    os.makedirs(repo, exist_ok=True)
    params = [tuple(kv.split("=", 1)) for kv in a.param]
    if a.model != "resnet50" and a.kind not in ("aoti", "torch"):
        p.error("--model fastpitch needs --kind aoti or torch")
    if a.graphs and a.kind == "embedding":
        p.error("--graphs is for the torch, onnx and aoti kinds")
    name, feeds, out, shape = make_model(a.kind, repo, a.gpu, params, a.model, a.graphs)
    extra = ["--model-control-mode=explicit"]
    tmp_dirs, tmp_before = [], set()
    if a.kind == "aoti":
        # the server's own TMPDIR, and /tmp (where a loader that ignores TMPDIR would unpack)
        server_tmp = os.path.join(a.work, "server_tmp")
        shutil.rmtree(server_tmp, ignore_errors=True)
        os.makedirs(server_tmp)
        os.environ["TMPDIR"] = server_tmp
        tmp_dirs = [server_tmp, "/tmp"]
        tmp_before = {os.path.join("/tmp", e) for e in os.listdir("/tmp")}
    if a.kind in ("torch", "aoti"):
        if not a.libtorch_dir:
            import torch
            a.libtorch_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
        extra.append(f"--backend-config=rust,libtorch-dir={a.libtorch_dir}")
    if a.kind == "onnx":
        extra.append(f"--backend-config=rust,onnxruntime-library={a.ort_lib}")
    smi = (subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
           if os.path.exists("/dev/nvidiactl") else "none (dry run)")
    print(f"GPU: {smi}; {a.kind}: model '{name}' on {'KIND_CPU' if a.gpu == 'cpu' else 'KIND_GPU'}, {a.cycles} load/infer/unload cycles"
          + (f"; parameters {dict(params)}" if params else "") + (f"; {a.infers} inferences a cycle" if a.infers != 1 else "")
          + ("; CUDA graphs asked for" if a.graphs else "")
          + (f"; MALLOC_ARENA_MAX={os.environ['MALLOC_ARENA_MAX']}" if os.environ.get("MALLOC_ARENA_MAX") else ""))
    rows = []
    left = {}
    t0 = time.time()
    with serve(a.server, repo, a.backends, a.port, f"/tmp/reload_{a.kind}.log", extra=extra) as client:
        pid = server_pid(a.port)
        rows.append((0, gpu_mib(pid), rss_mib(pid)))
        maps = {}
        print(f"{'cycle':>6} {'GPU MiB':>9} {'RSS MiB':>9} {'s/cycle':>8}")
        print(f"{0:>6} {rows[0][1]:>9.0f} {rows[0][2]:>9.0f}")
        last = time.time()
        for cycle in range(1, a.cycles + 1):
            status, body = post(a.port, f"/v2/repository/models/{name}/load")
            if status != 200:
                raise SystemExit(f"cycle {cycle}: load failed: {body}")
            for _ in range(a.infers):
                got = client.infer(name, feeds, [out])[out]
            want = shape or (len(next(iter(feeds.values()))),) + tuple(got.shape[1:])
            if tuple(got.shape) != want or not np.isfinite(got).all():
                raise SystemExit(f"cycle {cycle}: bad output {got.shape}")
            status, body = post(a.port, f"/v2/repository/models/{name}/unload")
            if status != 200:
                raise SystemExit(f"cycle {cycle}: unload failed: {body}")
            deadline = time.time() + 60
            while model_ready(a.port, name) and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # the backend's finalize runs after the model is marked unavailable
            if cycle % a.every == 0:
                rows.append((cycle, gpu_mib(pid), rss_mib(pid)))
                maps[cycle] = memory_map(pid)
                now = time.time()
                note = ""
                if tmp_dirs:
                    left[cycle] = unpacked_left(tmp_dirs, tmp_before)
                    note = f"  unpacked packages left: {len(left[cycle])}" + (f" ({left[cycle][:3]})" if left[cycle] else "")
                print(f"{cycle:>6} {rows[-1][1]:>9.0f} {rows[-1][2]:>9.0f} {(now - last) / a.every:>8.2f}{note}", flush=True)
                last = now
    base = next((r for r in rows if r[0] >= 20), rows[0])
    end = rows[-1]
    if base[0] in maps and end[0] in maps:
        m0, m1 = maps[base[0]], maps[end[0]]
        print(f"RSS by mapping, cycle {base[0]} -> {end[0]} (MiB; threads as a count): " + ", ".join(
            f"{k} {m0.get(k, 0):.0f}->{m1.get(k, 0):.0f}" for k in sorted(set(m0) | set(m1))))
    dg, dr = end[1] - base[1], end[2] - base[2]
    # issue 10's bound: 64 MiB each; issue 28's for AOTInductor packages: 64 MiB together
    together = a.kind == "aoti"
    ok = dg + dr <= 64 if together else dg <= 64 and dr <= 64
    print(f"after cycle {base[0]}: GPU {dg:+.0f} MiB, RSS {dr:+.0f} MiB"
          + (f", together {dg + dr:+.0f} MiB" if together else "")
          + f" over {end[0] - base[0]} cycles ({'within' if ok else 'OVER'} the 64 MiB bound"
          + (" for the two together" if together else " for each") + f"); {time.time() - t0:.0f} s")
    result = {"kind": a.kind, "rows": rows, "gpu_growth_mib": dg, "rss_growth_mib": dr}
    if a.kind == "aoti":
        # what the plugin said of the package's CUDA modules (crates/aoti/src/modules.cpp)
        with open(f"/tmp/reload_{a.kind}.log", errors="replace") as f:
            log = f.read()
        said = {k: log.count(k) for k in ("CUDA module loads are tracked", "CUDA modules cannot be tracked",
                                          "CUDA modules did not unload")}
        print(f"server log, per load: {said}")
        result["modules"] = said
    if tmp_dirs:
        # after the server's exit too: nothing of a package may stay behind
        final = unpacked_left(tmp_dirs, tmp_before)
        result["unpacked_left"] = {"per_check": {c: len(v) for c, v in left.items()}, "after_exit": final}
        clean = not final and not any(left.values())
        print(f"unpacked package folders left in {tmp_dirs}: "
              + ("none, at every check and after the server's exit" if clean else
                 f"{max((len(v) for v in left.values()), default=0)} at most during the run, {len(final)} after exit: {final[:5]}"))
        ok = ok and clean
    result["ok"] = ok
    print(json.dumps(result))


if __name__ == "__main__":
    main()
