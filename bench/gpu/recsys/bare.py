"""Figures without the server: the served network in torch with every table in HBM (eager and
CUDA-graphed, keys already on the GPU), and aoti_bare's figures for the AOTInductor package."""
import json
import subprocess
import time

import numpy as np

from .fixture import TABLES


def ceiling(name, module, rows, dim, batches, requests_of, iters=20):
    """Served-model's network in torch with all tables in HBM: {batch: {eager_ips, graph_ips}}."""
    import torch
    dev = torch.device("cuda")
    big = torch.empty((sum(rows), dim), dtype=torch.half, device=dev)
    big.normal_(0.0, 0.05)
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(rows)[:-1]]), dtype=torch.int64, device=dev)
    out = {}
    with torch.no_grad():
        for b in batches:
            reqs = [(torch.from_numpy(s).to(dev), torch.from_numpy(d).to(dev)) for s, d in requests_of(b)]

            def step(s, d):
                emb = big.index_select(0, (s + offsets).view(-1)).view(s.shape[0], TABLES, dim)
                return module(d, emb)

            for s, d in reqs[:3]:
                step(s, d)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(iters):
                step(*reqs[i % len(reqs)])
            torch.cuda.synchronize()
            eager = b * iters / (time.perf_counter() - t0)
            graph = None
            try:
                ss, sd = reqs[0][0].clone(), reqs[0][1].clone()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        step(ss, sd)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step(ss, sd)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for i in range(iters):
                    s, d = reqs[i % len(reqs)]
                    ss.copy_(s)
                    sd.copy_(d)
                    g.replay()
                torch.cuda.synchronize()
                graph = b * iters / (time.perf_counter() - t0)
                del g
            except Exception as e:  # noqa: BLE001 - capture refused: eager only
                print(f"  (no CUDA graph at batch {b}: {str(e).splitlines()[0][:100]})")
            out[b] = {"eager_ips": eager, "graph_ips": graph}
            print(f"  ceiling {name} batch {b}: eager {eager / 1e6:.2f} M/s, graph "
                  f"{'-' if graph is None else f'{graph / 1e6:.2f} M/s'}", flush=True)
            del reqs
    del big
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return out


def aoti_bare_figures(binary, pt2, batches):
    """{batch: aoti_bare's figures} for the package's network alone (inputs already on the GPU)."""
    cmd = [binary, "--package", pt2, "--batches", ",".join(map(str, batches)), "--iters", "50"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.stderr.strip():
        print("  " + p.stderr.strip()[-1000:], flush=True)
    if p.returncode != 0:
        print(f"  aoti_bare failed ({p.returncode}): {' '.join(cmd)}", flush=True)
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[r["batch"]] = r
            g = f", CUDA graph {r['graph_p50_ms']:.3f} ms ({r['graph_ips'] / 1e6:.2f} M/s)" if r["graph_p50_ms"] else ""
            print(f"  bare AOTI network batch {r['batch']}: plain {r['plain_p50_ms']:.3f} ms "
                  f"({r['plain_ips'] / 1e6:.2f} M/s){g}", flush=True)
    return out
