#!/usr/bin/env python3
"""Dense models served with and without CUDA graphs, against the bare engine (issue 9).

For ResNet50 and BERT-large QA in FP16 (TorchScript, fp16 inputs and outputs as the seeds
deploy them; BERT's ids stay int32), writes two server models each: `<m>_eager` and
`<m>_graphs` (`optimization { cuda { graphs: true } }`), and measures, in one run on one GPU:

- bare: the very model.pt the server loads, in torch with inputs already on the GPU:
  eager and CUDA-graphed, batch 1 latency (median) and largest-batch throughput;
- correctness: the served outputs (graphs, a batch padded into a larger bucket too) against
  torch eager within the fp16 tolerance;
- served: NVIDIA's perf_analyzer (gRPC, system shared memory, concurrency 1) at batch 1
  and the largest batch, and ResNet50 online (requests of batch 1, dynamic batching,
  concurrency 64). perf_analyzer's CSV files go to $OUT/perf/.

    python3 bench/gpu/dense_perf.py --server $PYT/pytriton/tritonserver/bin/tritonserver \\
        --backends /tmp/rust_backends --perf-analyzer /tmp/pa/perf_analyzer/bin/perf_analyzer
"""
import argparse
import csv
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
from tritonserver_process import serve  # noqa: E402

TOL = 5e-2  # fp16: |served - torch eager| per element


def config(name, max_batch, inputs, outputs, graphs, delay_us=0, count=1):
    opt = "optimization { cuda { graphs: true } }\n" if graphs else ""
    return (f'name: "{name}"\nbackend: "rust"\nmax_batch_size: {max_batch}\n'
            f'input [ {", ".join(inputs)} ]\noutput [ {", ".join(outputs)} ]\n'
            f'dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n'
            f'instance_group [ {{ count: {count} kind: KIND_GPU gpus: [ 0 ] }} ]\n{opt}'
            'parameters { key: "engine" value { string_value: "torch" } }\n')


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
    """(eager median ms, graph median ms, eager items/s, graph items/s) at `batch`."""
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
    return eager * 1e3, graph * 1e3, batch / eager, batch / graph


class Timing:
    """Averages the backend's verbose `timing:` lines (server run with --log-verbose=1)
    written since the last call: where a batch's time goes inside the server."""

    def __init__(self, log_path):
        self.log_path, self.offset = log_path, 0

    def since_last(self):
        import re
        with open(self.log_path) as f:
            f.seek(self.offset)
            text = f.read()
            self.offset = f.tell()
        sums, counts = {}, {}
        for line in text.splitlines():
            if "timing:" not in line:
                continue
            body = line.split("timing:", 1)[1].rstrip().rstrip('"')
            for label, value in re.findall(r"([a-z][a-z ]*?) (\d+)(?: us)?(?:,|$)", body):
                key = label.strip().split(",")[-1].strip()
                sums[key] = sums.get(key, 0) + int(value)
                counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{k} {sums[k] / counts[k]:.0f}" for k in sums)


def perf(pa, port, model, batch, conc, out_dir, extra=(), shm="system", must=True):
    path = os.path.join(out_dir, f"{model}_b{batch}_c{conc}{'_cudashm' if shm == 'cuda' else ''}.csv")
    cmd = [pa, "-m", model, "-b", str(batch), "--concurrency-range", f"{conc}:{conc}", "-i", "grpc",
           "-u", f"localhost:{port + 1}", "--shared-memory", shm, "--output-shared-memory-size", str(8 << 20),
           "--measurement-interval", "4000", "-f", path, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        if not must:
            print(f"perf_analyzer gave no figure: {' '.join(cmd)}", flush=True)
            return None
        raise SystemExit(f"perf_analyzer failed: {' '.join(cmd)}")
    with open(path) as f:
        row = next(csv.DictReader(f))
    r = {k: float(v) for k, v in row.items() if v not in ("", None)}
    # the CSV has no average column: the average is the sum of its parts
    r["Avg latency"] = sum(r[k] for k in ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
                                          "Server Compute Infer", "Server Compute Output", "Client Recv"))
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--perf-analyzer", required=True)
    p.add_argument("--libtorch-dir", default=os.path.join(os.path.dirname(torch.__file__), "lib"))
    p.add_argument("--work", default="/tmp/dense_perf")
    p.add_argument("--port", type=int, default=18900)
    p.add_argument("--only", default="", help="resnet50,bert")
    p.add_argument("--timing", action="store_true",
                   help="serve with --log-verbose=1 and print the backend's own time breakdown after each measurement")
    p.add_argument("--cuda-shm", action="store_true", help="also measure the largest batch with CUDA shared memory")
    a = p.parse_args()
    out_dir = os.path.join(os.environ.get("OUT", "/tmp/out"), "perf")
    os.makedirs(out_dir, exist_ok=True)
    repo = os.path.join(a.work, "repo")
    os.makedirs(repo, exist_ok=True)
    dev = torch.device("cuda:0")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print(f"GPU: {smi}; torch {torch.__version__}")
    only = set(filter(None, a.only.split(",")))

    models = []  # (label, base name, max batch, feeds(batch) -> dict, torch inputs(batch), outputs, pa extra)
    if not only or "resnet50" in only:
        torch.manual_seed(0)
        path = os.path.join(repo, "resnet50_eager", "1", "model.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.jit.script(torch_models.make("resnet50_pt").half().eval()).save(path)
        ins, outs = [tensor("INPUT__0", "TYPE_FP16", [3, 224, 224])], [tensor("OUTPUT__0", "TYPE_FP16", [1000])]
        rng = np.random.default_rng(0)
        feeds = lambda b: {"INPUT__0": rng.standard_normal((b, 3, 224, 224)).astype(np.float16)}  # noqa: E731
        models.append(("ResNet50 FP16", "resnet50", 128, ins, outs, feeds, ["OUTPUT__0"], []))
    if not only or "bert" in only:
        torch.manual_seed(0)
        path = os.path.join(repo, "bert_eager", "1", "model.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.jit.script(Bert16(torch_models.make("bert_large_pt")).eval()).save(path)
        ins = [tensor(f"input__{i}", "TYPE_INT32", [384]) for i in range(3)]
        outs = [tensor(f"output__{i}", "TYPE_FP16", [384]) for i in range(2)]
        rng = np.random.default_rng(1)

        def bert_feeds(b):
            seg = np.zeros((b, 384), np.int32)
            seg[:, 192:] = 1
            mask = np.ones((b, 384), np.int32)
            mask[:, 320:] = 0
            return {"input__0": rng.integers(1, 30522, (b, 384)).astype(np.int32), "input__1": seg, "input__2": mask}
        models.append(("BERT-large QA FP16", "bert", 16, ins, outs, bert_feeds, ["output__0", "output__1"],
                       ["--input-data", "zero"]))
    for _, base, mb, ins, outs, *_ in models:
        # offline (clients send whole batches): one instance, no queue delay; online
        # (ResNet50, requests of batch 1): two instances, so one stages a batch while
        # the other computes, and 200 us for a batch to gather
        modes = ("eager", "graphs") + (("online",) if base == "resnet50" else ())
        for mode in modes:
            name = f"{base}_{mode}"
            os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
            if mode != "eager":
                src, dst = os.path.join(repo, f"{base}_eager", "1", "model.pt"), os.path.join(repo, name, "1", "model.pt")
                if not os.path.exists(dst):
                    os.link(src, dst)
            with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
                if mode == "online":
                    f.write(config(name, mb, ins, outs, True, delay_us=200, count=2))
                else:
                    f.write(config(name, mb, ins, outs, mode == "graphs"))

    # bare references: the files the server loads
    refs = {}
    for label, base, mb, ins, outs, feeds, onames, _ in models:
        module = torch.jit.load(os.path.join(repo, f"{base}_eager", "1", "model.pt"), map_location=dev).eval()
        to_dev = lambda b: [torch.from_numpy(v).to(dev) for v in feeds(b).values()]  # noqa: E731
        b1 = bare(module, to_dev, 1, 300)
        bl = bare(module, to_dev, mb, 30)
        b64 = bare(module, to_dev, 64, 30) if base == "resnet50" else None
        refs[base] = (b1, bl, module, b64)
        print(f"bare {label}: batch 1 eager {b1[0]:.2f} ms, CUDA graph {b1[1]:.2f} ms; "
              f"batch {mb} eager {bl[2]:.0f}/s, CUDA graph {bl[3]:.0f}/s"
              + (f"; batch 64 eager {b64[2]:.0f}/s" if b64 else ""))

    extra = ["--model-control-mode=none", f"--backend-config=rust,libtorch-dir={a.libtorch_dir}"]
    if a.timing:
        extra.append("--log-verbose=1")
    timing = Timing("/tmp/dense_perf_server.log")
    rows = []
    with serve(a.server, repo, a.backends, a.port, "/tmp/dense_perf_server.log", extra=extra) as client:
        # correctness: graphs (batch 3 is padded into the bucket of 4) and eager against torch eager
        for label, base, mb, ins, outs, feeds, onames, _ in models:
            module = refs[base][2]
            for b in (1, 3):
                f = feeds(b)
                with torch.inference_mode():
                    want = module(*[torch.from_numpy(v).to(dev) for v in f.values()])
                want = [want] if isinstance(want, torch.Tensor) else list(want)
                for mode in ("eager", "graphs"):
                    got = client.infer(f"{base}_{mode}", f, onames)
                    diff = max(float(np.abs(got[n].astype(np.float32) - w.float().cpu().numpy()).max())
                               for n, w in zip(onames, want))
                    ok = diff <= TOL
                    print(f"check {label} {mode} batch {b}: max abs diff {diff:.2e} "
                          f"({'within' if ok else 'OVER'} {TOL})")
                    if not ok:
                        raise SystemExit("wrong answer")
        print()
        print(f"{'model':<20} {'mode':<7} {'batch':>5} {'conc':>4} {'infer/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'avg ms':>7} {'infer ms':>8} {'bare eager':>10} {'bare graph':>10} {'served/bare graph':>17}")
        timing.since_last()
        for label, base, mb, ins, outs, feeds, onames, pa_extra in models:
            b1, bl, _, _ = refs[base]
            runs = [(1, "system"), (mb, "system")] + [(mb, "cuda")] * a.cuda_shm
            for batch, shm in runs:
                for mode in ("eager", "graphs"):
                    r = perf(a.perf_analyzer, a.port, f"{base}_{mode}", batch, 1, out_dir, pa_extra, shm)
                    rows.append((label, mode, batch, 1, r))
                    if batch == 1:
                        ref_e, ref_g, ratio = f"{b1[0]:.2f} ms", f"{b1[1]:.2f} ms", r["p50 latency"] / 1e3 / b1[1]
                    else:
                        ref_e, ref_g, ratio = f"{bl[2]:.0f}/s", f"{bl[3]:.0f}/s", r["Inferences/Second"] / bl[3]
                    print(f"{label:<20} {mode:<7} {batch:>5} {1:>4} {r['Inferences/Second']:>9.0f} "
                          f"{r['p50 latency'] / 1e3:>7.2f} {r['p99 latency'] / 1e3:>7.2f} {r['Avg latency'] / 1e3:>7.2f} "
                          f"{r['Server Compute Infer'] / 1e3:>8.2f} {ref_e:>10} {ref_g:>10} {ratio:>17.2f}"
                          + (" (CUDA shared memory)" if shm == "cuda" else ""), flush=True)
                    if a.timing:
                        print(f"    backend timing (mean): {timing.since_last()}")
        # online: requests of batch 1, dynamic batching
        for label, base, mb, ins, outs, feeds, onames, pa_extra in models:
            if base != "resnet50":
                continue
            b64 = refs[base][3]
            for mode in ("eager", "graphs", "online"):
                # online load does not always settle within perf_analyzer's trials; a
                # missing figure is reported, not fatal
                r = perf(a.perf_analyzer, a.port, f"{base}_{mode}", 1, 64, out_dir, [*pa_extra, "--max-trials", "20"], must=False)
                if r is None:
                    continue
                rows.append((label, mode, 1, 64, r))
                print(f"{label:<20} {mode:<7} {1:>5} {64:>4} {r['Inferences/Second']:>9.0f} "
                      f"{r['p50 latency'] / 1e3:>7.2f} {r['p99 latency'] / 1e3:>7.2f} {r['Avg latency'] / 1e3:>7.2f} "
                      f"{r['Server Compute Infer'] / 1e3:>8.2f} {b64[2]:>8.0f}/s {b64[3]:>8.0f}/s "
                      f"{r['Inferences/Second'] / b64[2]:>13.2f} (vs bare eager, batch 64)", flush=True)
                if a.timing:
                    print(f"    backend timing (mean): {timing.since_last()}")
    print("\nserver log lines about CUDA graphs:")
    with open("/tmp/dense_perf_server.log") as f:
        for line in f:
            if "CUDA graph" in line:
                print("  " + line.strip()[:200])


if __name__ == "__main__":
    main()
