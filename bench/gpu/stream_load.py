"""An endless stream of recommender requests at the cache's stationary hit rate.

perf_analyzer cycles a pool of distinct requests that it reads as JSON. A pool whose measured
hit rate is the endless stream's must hold about twice the LRU cache's characteristic time of
lookups per table (recsys/cache.py's pool_plan): at Criteo scale with a 10% cache, 1.2e8 lookups per
table, 26 GB of int64 keys. That cannot go through JSON. Here the pool is drawn on the GPU
(the same Zipf law and rank-to-key map as zipf_keys.py) straight into one CUDA shared-memory
region, and each request names its slice of it by offset, as Triton's shared-memory protocol
allows; outputs go to a region per request in flight. (For CPU instances the pool is drawn on
the CPU into POSIX shared memory instead.) One thread per request in flight sends the pool's
requests in order, through HTTP: examples/stream_client.rs's compiled threads where
`client_bin` names it (a Python thread's own cost per request is a large part of a 4096-row
request's time), else Python's. One pass of the pool warms the cache; the next passes are
measured: inferences/s, latency percentiles (client side), and the hit rate from the server's
own metrics.

This is our client, not NVIDIA's perf_analyzer: its figures stand beside perf_analyzer's rows,
labelled, for what perf_analyzer cannot send.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time

import numpy as np

import zipf_keys
from recsys import measure

TABLES = 26
DENSE_POOL = 16  # distinct dense-feature blocks (the hit rate depends on the keys alone)


def torch_zipf_ranks(gen, n_rows, alpha, count, device):
    """zipf_keys.zipf_ranks drawn by torch on `device`: the first 2^20 ranks from the exact
    discrete law (a search of its cumulative weights), the tail by inverting the continuous law."""
    import torch
    cdf, head, tail = zipf_keys._law(n_rows, alpha)
    cdf_t = torch.as_tensor(cdf, dtype=torch.float64, device=device)
    u = torch.rand(count, generator=gen, dtype=torch.float64, device=device) * (head + tail)
    ranks = torch.searchsorted(cdf_t, u, right=True).clamp_(max=len(cdf) - 1)
    if tail > 0:
        v = (u - head).clamp_(min=0.0)
        lo = len(cdf) + 0.5
        if abs(alpha - 1.0) < 1e-12:
            x = lo * torch.exp(v)
        else:
            x = (lo ** (1 - alpha) + v * (1 - alpha)) ** (1 / (1 - alpha))
        tail_ranks = (torch.floor(x + 0.5).to(torch.int64) - 1).clamp_(len(cdf), n_rows - 1)
        ranks = torch.where(u < head, ranks, tail_ranks)
    return ranks


def torch_spread(ranks, n_rows):
    """zipf_keys.spread on a tensor: the same bijection of [0, n_rows)."""
    if n_rows <= 1:
        return ranks
    p = zipf_keys.PRIME % n_rows
    while math.gcd(p, n_rows) != 1:
        p += 1
    return (ranks * p) % n_rows


def draw_keys(rows, batch, requests, alpha, seed, device, chunk=16):
    """The pool's keys, `chunk` requests at a time: int64 tensors [chunk, batch, tables] on `device`."""
    import torch
    gen = torch.Generator(device=device).manual_seed(seed)
    for first in range(0, requests, chunk):
        n = min(chunk, requests - first)
        keys = torch.empty((n, batch, len(rows)), dtype=torch.int64, device=device)
        for t, rows_t in enumerate(rows):
            keys[:, :, t] = torch_spread(torch_zipf_ranks(gen, rows_t, alpha, n * batch, device), rows_t).view(n, batch)
        yield first, keys


class HostRegion:
    """`nbytes` of POSIX shared memory registered with the server as region `name` (for CPU
    instances; the same interface as cuda_shm.Region)."""

    def __init__(self, client, name: str, nbytes: int):
        import mmap
        self.client, self.name, self.nbytes = client, name, nbytes
        self.path = f"/dev/shm/{name}"
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self.map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        client.register_system_shm(name, f"/{name}", nbytes)

    def view(self, offset: int, count: int, dtype) -> np.ndarray:
        return np.frombuffer(self.map, dtype=dtype, count=count, offset=offset)

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        a = np.ascontiguousarray(array)
        self.map[offset:offset + a.nbytes] = a.tobytes()

    def write_tensor(self, tensor, offset: int = 0) -> None:
        """Copies a contiguous CPU tensor into the region at `offset`."""
        self.write(tensor.numpy(), offset)

    def __exit__(self, *exc):
        try:
            self.client.unregister_system_shm(self.name)
        finally:
            self.map.close()
            os.unlink(self.path)


def percentile(sorted_ms, q):
    return sorted_ms[min(len(sorted_ms) - 1, int(q / 100 * len(sorted_ms)))] if sorted_ms else float("nan")


def run(client_of, scrape, model, rows, batch, requests, alpha, seed, concurrency, passes=1, gpu=True, device=0,
        log=print, client_bin=None, url=None, devices=None):
    """Draws a pool of `requests` distinct requests into GPU memory (`gpu`; else POSIX shared
    memory, for CPU instances), warms the cache with one pass, then measures `passes` passes at
    each number of requests in flight that `concurrency` lists, in turn (one result each).
    `client_of()`: a new kserve_client.Client; `scrape()`: (keys looked up, cache hits) from the
    server's metrics; `client_bin`, `url`: the compiled sender (examples/stream_client.rs) and
    the server's HTTP address, else Python threads send; `devices()`: {device: inferences run
    there} from the server's metrics, for per-device rates. Returns a list, one {inferences_per_s,
    p50/p90/p95/p99 ms, hit_rate, pool_requests, pool_gb, client, per_device, ...} per entry of
    `concurrency`."""
    import torch

    req_bytes = batch * TABLES * 8
    dense_bytes = batch * 13 * 4
    out_bytes = batch * 4
    admin = client_of()
    t0 = time.time()
    if gpu:
        from cuda_shm import Region

        def region(name, nbytes):
            return Region(admin, name, nbytes, device)
    else:
        def region(name, nbytes):
            return HostRegion(admin, name, nbytes)
    made = []
    try:
        keys = region(f"stream_keys_{model}", requests * req_bytes)
        made.append(keys)
        dense = region(f"stream_dense_{model}", DENSE_POOL * dense_bytes)
        made.append(dense)
        outs = []
        for i in range(max(concurrency)):
            outs.append(region(f"stream_out_{model}_{i}", out_bytes))
            made.append(outs[-1])
        for first, chunk in draw_keys(rows, batch, requests, alpha, seed, f"cuda:{device}" if gpu else "cpu"):
            keys.write_tensor(chunk.contiguous(), first * req_bytes)
        if gpu:
            torch.cuda.synchronize()
        rng = np.random.default_rng(seed + 1)
        dense.write(rng.random((DENSE_POOL, batch, 13), dtype=np.float32))
        drawn_s = time.time() - t0
        log(f"    stream pool: {requests} distinct requests of {batch} ({requests * batch:,} lookups per table, "
            f"{requests * req_bytes / 1e9:.1f} GB of keys in {'GPU' if gpu else 'shared'} memory) drawn in {drawn_s:.0f} s", flush=True)

        lock = threading.Lock()
        state = {"next": 0, "stop": 0, "error": None}
        latencies: list = []

        def worker(slot):
            client = client_of()
            mine = []
            try:
                while True:
                    with lock:
                        i = state["next"]
                        if i >= state["stop"]:
                            break
                        state["next"] = i + 1
                    k = i % requests
                    d = k % DENSE_POOL
                    shm = {"sparse": (keys.name, k * req_bytes, req_bytes, (batch, TABLES), np.int64),
                           "dense": (dense.name, d * dense_bytes, dense_bytes, (batch, 13), np.float32)}
                    s = time.perf_counter()
                    client.infer(model, {}, ["prediction"], shm=shm,
                                 out_shm={"prediction": (outs[slot].name, 0, out_bytes)})
                    mine.append((time.perf_counter() - s) * 1e3)
            except Exception as e:  # noqa: BLE001 (reported below, the run fails)
                state["error"] = e
            finally:
                client.close()
            with lock:
                latencies.extend(mine)

        def send_compiled(count, inflight):
            """`count` requests through examples/stream_client.rs (the same requests, sent by
            compiled threads): its own wall-clock seconds."""
            cmd = [client_bin, "--url", url, "--model", model, "--start", str(state["next"]), "--count", str(count),
                   "--concurrency", str(inflight),
                   "--input", f"sparse,INT64,{batch}x{TABLES},{keys.name},{req_bytes},{requests}",
                   "--input", f"dense,FP32,{batch}x13,{dense.name},{dense_bytes},{DENSE_POOL}",
                   "--output", f"prediction,stream_out_{model}_,{out_bytes}"]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"stream request failed: {p.stderr.strip()[-2000:]}")
            r = json.loads(p.stdout)
            latencies.extend(r["latencies_ms"])
            state["next"] += count
            return r["seconds"]

        def send(count, inflight):
            if client_bin:
                return send_compiled(count, inflight)
            with lock:
                state["stop"] = state["next"] + count
            threads = [threading.Thread(target=worker, args=(i,)) for i in range(inflight)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if state["error"] is not None:
                raise RuntimeError(f"stream request failed: {state['error']}")
            return time.perf_counter() - start

        warm_s = send(requests, max(concurrency))
        results = []
        for level in concurrency:  # the stream goes on where the last level left it: the cache stays warm
            latencies.clear()
            time.sleep(measure.METRICS_SETTLE_S)  # every lookup so far in the published metrics
            k0, h0 = scrape()
            d0 = devices() if devices else {}
            seconds = send(requests * passes, level)
            time.sleep(measure.METRICS_SETTLE_S)
            k1, h1 = scrape()
            d1 = devices() if devices else {}
            per_device = measure.per_device(d0, d1, requests * passes * batch / seconds)
            lat = sorted(latencies)
            results.append({"inferences_per_s": requests * passes * batch / seconds, "seconds": seconds,
                            "warmup_seconds": warm_s, "p50_ms": percentile(lat, 50), "p90_ms": percentile(lat, 90),
                            "p95_ms": percentile(lat, 95), "p99_ms": percentile(lat, 99),
                            "hit_rate": (h1 - h0) / (k1 - k0) if k1 > k0 else None, "pool_requests": requests,
                            "pool_lookups_per_table": requests * batch, "pool_gb": requests * req_bytes / 1e9,
                            "concurrency": level, "passes": passes, "drawn_seconds": drawn_s,
                            "per_device": per_device,
                            "client": "stream_client (compiled)" if client_bin else "Python threads"})
        return results
    finally:
        for r in reversed(made):
            try:
                r.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 (best effort at the end of a run)
                pass
        admin.close()
