#!/usr/bin/env python3
"""DLRM-v3 served, timed (issue 68, step 5's first form; run.sh dlrm-v3-perf): the network at the
benchmark's configuration (5 HSTU layers, 4 heads of 128, width 512) exported in this run as a
package on the device, its tables (folded to --items item rows; rows of 512 in fp16 as the
benchmark's, or --tables fp32; the network takes the rows as stored) written in the store's format
behind a GPU cache (--cache of the item table's rows, the user and category tables whole;
--cache-tables each: of every table's rows; --cache-rows fp16: fp16 cache slots), one model on
--instances instances, and requests of the benchmark's shape (examples/dlrm_v3/data.py: histories
around 6,400 items, 2,048 candidates; a request is a query, one user) sent by --concurrency clients
each sending its next request when the last is answered, for --seconds a level. Printed, a line a
level: queries (samples) a second, p50 and p99 ms a query, and the executions' mean batch; before
them, a few answers against the reference on the same device (bf16, the bound --tolerance). In the
same run, the reference (examples/dlrm_v3/model.py's padded form), compiled by torch.compile and
eager, on batches of the same requests: its queries a second, and the served rate's ratios to each.

With --fresh-users N, each share is served again on a new server to N users drawn before it
starts, each sent once across the levels: a stream of users it has not seen, as far as N lasts
(a level that runs out says so), first for --fresh-warm-s seconds uncounted. No drawer shares the
server's cores while it serves (the --stream's drawers do, and can hold its rate).

With --stream, each share is served again on a new server to a stream of users without end
(recsys/user_stream.py: --processes processes draw users while the levels run, none drawn
twice), first for --stream-warm-s seconds uncounted so that the cache holds what the stream
keeps asking for, then a line a client count. Each such line says the share of the clients'
time spent waiting for a user: past 5%, the drawers, not the server, held the rate.

Every level's line gives the GPU cache's hit rate over it (the server's metrics).

With --perf-analyzer PATH (run.sh passes it when .carry_pa is carried), perf_analyzer runs on each
share's repeating users too: gRPC, a request one user at its own ragged shapes (a JSON input
file), a line a concurrency in the seeds' columns.

With --item-rows N (more than the reference's --items rows P), the served item table has N rows,
row k holding the reference's row k % P in fp16 (the reference's rows rounded to fp16 alike): a
table as large as host memory allows, while the reference holds P rows and is run on the same
requests with their item ids taken % P. The requests' ids then range over N, so the GPU cache
sees N distinct rows.

Not yet what the issue asks in full: no 1 TB table (--item-rows writes the largest the host's
memory holds).

    python3 bench/gpu/dlrm_v3_perf.py --server $TRITONSERVER --backends $BACKENDS [--concurrency 1,4,8]
    python3 bench/gpu/dlrm_v3_perf.py ... --device cpu --tiny [--fresh-users 200] [--stream]   # the code paths, here

Writes its lines to $OUT/dlrm_v3_perf.txt when OUT is set.
"""
import argparse
import csv
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
from dlrm_v3 import data as dv3_data  # noqa: E402
from dlrm_v3 import export  # noqa: E402
from dlrm_v3 import kernels  # noqa: E402
from dlrm_v3 import model as dv3  # noqa: E402
from dlrm_v3.client import feeds  # noqa: E402
from dlrm_v3_serve import MODEL, config  # noqa: E402
from kserve_client import Client  # noqa: E402
from recsys.measure import METRICS_SETTLE_S, scrape  # noqa: E402
from recsys.transcript import Transcript  # noqa: E402
from recsys.user_stream import UserStream  # noqa: E402
from tritonserver_process import serve  # noqa: E402

say = Transcript("dlrm_v3_perf.txt").say



def model_config(cfg: dv3.Config, a, share: str) -> str:
    """models/dlrm_v3's config at this run's sizes (the item table's served rows) and instances."""
    kind = f"count: {a.instances} kind: KIND_GPU gpus: [ 0 ]" if a.device == "cuda" else f"count: {a.instances} kind: KIND_CPU"
    text = config("kind: KIND_CPU").replace("count: 1 kind: KIND_CPU", kind).replace("max_batch_size: 32", f"max_batch_size: {a.max_batch}")
    text = text.replace('"embedding_vecsize_per_table" value { string_value: "32" }',
                        f'"embedding_vecsize_per_table" value {{ string_value: "{cfg.table_dim}" }}')
    text = text.replace('"vocabulary_size_per_table" value { string_value: "4096,1000,128" }',
                        f'"vocabulary_size_per_table" value {{ string_value: "{served_items(cfg, a)},{cfg.num_user_rows},{cfg.num_category_rows}" }}')
    text = text.replace('"sequence_max_length" value { string_value: "128" }',
                        f'"sequence_max_length" value {{ string_value: "{cfg.max_seq_len}" }}')
    # a request's predictions, one a candidate, as one variable dimension: perf_analyzer sizes
    # an output's shared memory from the config's dims, and a fixed [ 1 ] would be one prediction
    text = text.replace('output [ { name: "predictions" data_type: TYPE_FP32 dims: [ 1 ] } ]',
                        'output [ { name: "predictions" data_type: TYPE_FP32 dims: [ -1 ] } ]')
    text += f'parameters {{ key: "gpucacheper" value {{ string_value: "{share}" }} }}\n'
    if a.cache_tables == "items":
        # the item table behind the share, the user and category tables whole (in the order of
        # embedding_table_names: item_id, user_id, category)
        text += f'parameters {{ key: "gpucacheper_per_table" value {{ string_value: "{share},1.0,1.0" }} }}\n'
    if a.cache_rows == "fp16":
        text += 'parameters { key: "gpucache_row_type" value { string_value: "fp16" } }\n'
    return text


def served_items(cfg: dv3.Config, a) -> int:
    """The served item table's rows: --item-rows, or the reference's own."""
    return max(a.item_rows, cfg.num_item_rows)


def folded(requests, rows: int):
    """`requests` with their item ids taken % `rows`: what the reference, which holds `rows` item
    rows, looks up for the served table's row k (row k % rows; see --item-rows)."""
    return [dataclasses.replace(r, item_ids=r.item_ids % rows, cand_item_ids=r.cand_item_ids % rows)
            for r in requests]


def write_item_table(directory: str, base: torch.Tensor, rows: int, chunk: int = 1 << 20) -> None:
    """The served item table of `rows` rows in the store's format, fp16: row k is `base`'s row
    k % len(base) (written a chunk at a time, so it may be far larger than the reference's)."""
    base16 = base.detach().half().cpu().numpy()
    for name in ("keys.npy", "vectors.npy"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            os.remove(path)
    keys = np.lib.format.open_memmap(os.path.join(directory, "keys.npy"), "w+", np.int64, (rows,))
    vectors = np.lib.format.open_memmap(os.path.join(directory, "vectors.npy"), "w+", np.float16,
                                        (rows, base16.shape[1]))
    for k in range(0, rows, chunk):
        at = np.arange(k, min(rows, k + chunk), dtype=np.int64)
        keys[k:k + len(at)] = at
        vectors[k:k + len(at)] = base16[at % len(base16)]
    keys.flush()
    vectors.flush()
    del keys, vectors


def queries_per_s(fn, sub, queries: int, warm: int, reps: int, sync) -> float:
    """`fn(sub)` (a batch of `queries`) run `warm` times, then timed over `reps`: queries a second.
    No grad, the warm-up too (grad mode is one of torch.compile's guards)."""
    with torch.no_grad():
        for _ in range(warm):
            fn(sub)
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(sub)
        sync()
    return reps * queries / (time.perf_counter() - t0)


class Fresh:
    """Users each sent once, across every level, in order: `next()` gives the next unsent one,
    or None when all have been sent (the level then ends early and says so)."""

    def __init__(self, jobs):
        self.jobs, self.at, self.lock = jobs, 0, threading.Lock()

    def next(self):
        with self.lock:
            if self.at >= len(self.jobs):
                return None
            self.at += 1
            return self.jobs[self.at - 1]


def level(port: int, jobs, clients: int, seconds: float, fresh=None):
    """`clients` threads each sending requests for `seconds`, round robin over `jobs`, or each
    user once from `fresh` (a `Fresh` until it runs out, or a `UserStream`): (queries a second,
    latencies in ms)."""
    lat, lock, stop = [], threading.Lock(), time.time() + seconds

    def one(c):
        client, i, mine = Client(f"localhost:{port}"), c, []
        while time.time() < stop:
            job = fresh.next() if fresh else jobs[i % len(jobs)]
            if job is None:
                break
            t0 = time.perf_counter()
            client.infer(MODEL, job, ["predictions"])
            mine.append((time.perf_counter() - t0) * 1e3)
            i += clients
        client.close()
        with lock:
            lat.extend(mine)

    t0 = time.time()
    threads = [threading.Thread(target=one, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(lat) / (time.time() - t0), lat


# the seeds' columns (NVIDIA's DeepLearningExamples Triton reports), from perf_analyzer's CSV
PA_COLUMNS = ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
              "Server Compute Infer", "Server Compute Output", "Client Recv",
              "p50 latency", "p90 latency", "p95 latency", "p99 latency")


def perf_analyzer(a, jobs, label: str):
    """perf_analyzer (gRPC, batch 1: a request is one user) over `jobs` as its input data, each
    request's inputs at their own ragged shapes, at --pa-concurrency: a line a concurrency in the
    seeds' columns (ms). Nothing when --perf-analyzer is not given."""
    if not a.perf_analyzer:
        return
    out = os.environ.get("OUT") or tempfile.gettempdir()
    data = os.path.join(out, "dlrm_v3_pa_input.json")  # this run's users, written afresh
    with open(data, "w") as f:
        json.dump({"data": [{name: {"content": arr.reshape(-1).tolist(), "shape": [int(arr.shape[1])]}
                             for name, arr in job.items()} for job in jobs]}, f)
    table = os.path.join(out, f"dlrm_v3_pa_cache{label}.csv")
    cmd = [a.perf_analyzer, "-m", MODEL, "-u", f"localhost:{a.port + 1}", "-i", "grpc", "-b", "1",
           "--input-data", data, "--concurrency-range", a.pa_concurrency,
           "--measurement-interval", str(a.pa_interval_ms), "-f", table]
    if a.pa_shm != "none":
        # inputs and outputs in shared memory: the predictions' region sized for the most
        # candidates a request has (the config's `dims: [ -1 ]` lets perf_analyzer take it)
        most = max(int(job["cand_item_ids"].shape[1]) for job in jobs)
        cmd += ["--shared-memory", a.pa_shm, "--output-shared-memory-size", str(4 * most)]
    say(f"  perf_analyzer, cache {label}: gRPC, "
        + (f"inputs and outputs in {a.pa_shm} shared memory" if a.pa_shm != "none" else "no shared memory"))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.pa_timeout_s)
    except subprocess.TimeoutExpired:
        say(f"  perf_analyzer, cache {label}: stopped after {a.pa_timeout_s} s")
        return
    if r.returncode != 0 or not os.path.exists(table):
        say(f"  perf_analyzer, cache {label}: failed ({r.returncode}): {(r.stderr or r.stdout)[-600:]}")
        return
    with open(table) as f:
        for row in csv.DictReader(f):
            cols = "  ".join(f"{c.replace(' latency', '')} {float(row[c]) / 1e3:.1f}" for c in PA_COLUMNS if row.get(c))
            say(f"  perf_analyzer, cache {label}, concurrency {row['Concurrency']}: "
                f"{float(row['Inferences/Second']):.1f} queries/s; ms: {cols}")


def make_users(data, cfg, items: int, n: int, seed: int, step, processes: int):
    """n distinct users of the benchmark's shape at inference step `step`, ids folded into the
    tables' rows (`items` item rows), drawn by `processes` processes (spawned: this process holds
    CUDA; a user at the benchmark's shape takes ~8 ms to draw)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    chunk = 64
    parts = [(seed * 100_003 + k, min(chunk, n - k * chunk)) for k in range((n + chunk - 1) // chunk)]
    jobs = [(data, items, cfg.num_user_rows, step, part) for part in parts]
    with ProcessPoolExecutor(max(1, processes), mp_context=multiprocessing.get_context("spawn")) as pool:
        users = list(pool.map(_user_chunk, jobs))
    return [r for part in users for r in part]


def _user_chunk(args):
    data, items, users, step, (seed, n) = args
    batch = dv3_data.generate_batch(data, n, seed, step)
    batch.hist_item_ids = batch.hist_item_ids % items
    batch.cand_item_ids = batch.cand_item_ids % items
    batch.user_ids = batch.user_ids % users
    return batch.requests()


def hits(port: int):
    """(keys looked up, GPU cache hits) so far, from the server's metrics once its last lookups
    are published; None where it has none."""
    time.sleep(METRICS_SETTLE_S)
    try:
        return scrape(port, MODEL)
    except OSError:
        return None


def hit_rate(before, after) -> str:
    if before is None or after is None or after[0] <= before[0]:
        return "hit rate -"
    return f"hit rate {(after[1] - before[1]) / (after[0] - before[0]):.4f}"


def serve_level(a, repo, log, requests, jobs, reference, share, fresh=None):
    """Serves the model at one cache share on a new server: a few answers checked, then each
    client count's line (its users from `fresh` when given, each sent once: a stream of users
    the server has not seen, its cache cold at the start; a `UserStream` is first sent for
    --stream-warm-s uncounted). Returns the best queries a second."""
    stream = isinstance(fresh, UserStream)
    label = f"{share} (stream)" if stream else f"{share} (fresh users)" if fresh else share
    best = 0.0
    with serve(a.server, repo, a.backends, a.port, log) as client, torch.no_grad():
        worst = 0.0
        for r, job in list(zip(requests, jobs))[:4]:
            got = client.infer(MODEL, job, ["predictions"])["predictions"]
            rows = reference.cfg.num_item_rows
            want = reference.score_candidates(dv3.Batch.from_requests(folded([r], rows)).to(a.device)).float().cpu().numpy()
            worst = max(worst, float(np.abs(got - want).max()))
        which = "the item table's rows, the other tables whole" if a.cache_tables == "items" else "each table's rows"
        say(f"GPU cache of {label} of {which} ({a.cache_rows} rows): 4 answers against the reference on the same device: "
            f"largest difference {worst:.1e} ({'within' if worst <= a.tolerance else 'PAST'} {a.tolerance:g})")
        counts = [int(x) for x in a.concurrency.split(",")]
        warm_s = a.stream_warm_s if stream else a.fresh_warm_s if fresh is not None else 0
        if warm_s > 0:
            qps, _ = level(a.port, jobs, max(counts), warm_s, fresh)
            say(f"  served, cache {label}: {warm_s:g} s uncounted first, {max(counts)} clients, "
                f"{qps:.1f} queries/s")
        seen = hits(a.port)  # then each level's end is the next one's start
        for c in counts:
            before = client.stats(MODEL)
            waited = fresh.waited() if stream else None
            qps, lat = level(a.port, jobs, c, a.seconds, fresh)
            after, seen_after = client.stats(MODEL), hits(a.port)
            if not lat:
                say(f"  served, cache {label}, {c:3d} clients: no fresh users left")
                break
            execs = max(1, after["execution_count"] - before["execution_count"])
            best = max(best, qps)
            out = fresh is not None and not stream and fresh.at >= len(fresh.jobs)
            note = f" ({len(lat)} queries: the fresh users ran out)" if out else ""
            if stream:
                sent, wait_s = (x - y for x, y in zip(fresh.waited(), waited))
                share_waited = wait_s / (c * a.seconds)
                note = (f"; {sent} users, the clients waited for one {100 * share_waited:.1f}% of their time"
                        + (" (the drawers held the rate)" if share_waited > 0.05 else ""))
            say(f"  served, cache {label}, {c:3d} clients: {qps:8.1f} queries/s  p50 {np.percentile(lat, 50):8.1f}  "
                f"p99 {np.percentile(lat, 99):8.1f} ms  {(after['inference_count'] - before['inference_count']) / execs:.1f} "
                f"queries an execution, {hit_rate(seen, seen_after)}{note}")
            seen = seen_after
        if fresh is None:
            perf_analyzer(a, jobs, share)
    return best


def serve_shares(a, repo, cfg, requests, jobs, reference, fresh_jobs, stream, served):
    """Each --cache share served in turn (a new server each time; `served[(share, kind)]`: its
    best queries a second, kind "" for the repeating users, "fresh" and "stream")."""
    for share in a.cache.split(","):
        # the same tables and package, served again with the GPU cache at this share of the rows
        with open(os.path.join(repo, MODEL, "config.pbtxt"), "w") as f:
            f.write(model_config(cfg, a, share))
        log = os.path.join(os.environ.get("OUT", repo), f"dlrm_v3_perf_server_cache{share}.log")
        served[(share, "")] = serve_level(a, repo, log, requests, jobs, reference, share)
        if fresh_jobs:
            # the same server again, a new one, on users it has not seen
            served[(share, "fresh")] = serve_level(a, repo, log.replace(".log", "_fresh.log"), requests, jobs,
                                                   reference, share, Fresh(fresh_jobs))
        if stream:
            served[(share, "stream")] = serve_level(a, repo, log.replace(".log", "_stream.log"), requests, jobs,
                                                    reference, share, stream)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="Config.tiny() and its data: the code paths, quickly")
    p.add_argument("--items", type=int, default=None, help="the reference's item table rows (the benchmark's 1e9 "
                   "folded; default 2^19, with --tiny the tiny config's)")
    p.add_argument("--item-rows", type=int, default=0, help="the served item table's rows, past --items: row k "
                   "holds the reference's row k %% --items in fp16 (see above)")
    p.add_argument("--cache", default="0.1,1.0", help="gpucacheper, the share of the item table's rows (--cache-tables) the GPU "
                   "cache holds: each in turn, the same tables and package (1.0: every row in HBM)")
    p.add_argument("--cache-tables", choices=["items", "each"], default="items",
                   help="items: the --cache share of the item table alone, the user and category tables "
                   "whole (gpucacheper_per_table); each: the share of every table (gpucacheper alone, "
                   "HPS's meaning: the 128-row category table gets 13 slots at 0.1; the calls up to "
                   "2026-11-30 ran so)")
    p.add_argument("--cache-rows", choices=["fp32", "fp16"], default="fp32",
                   help="gpucache_row_type: fp16 slots, half the GPU memory a row")
    p.add_argument("--tables", choices=["fp16", "fp32"], default="fp16",
                   help="fp16: every table's rows in fp16 as the benchmark's, the network taking them as "
                   "stored (a miss's row goes up as read); fp32: fp32 rows to the network, the tables in "
                   "fp32 but for an --item-rows item table, fp16 and widened on the host a miss at a time "
                   "(the calls up to 2026-11-30 ran so)")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--requests", type=int, default=32, help="distinct requests sent round robin")
    p.add_argument("--fresh-users", type=int, default=0,
                   help="also serve each cache share again to this many more users, each sent once across "
                   "the levels (a stream of fresh users, as far as they last), drawn before the server starts")
    p.add_argument("--fresh-warm-s", type=float, default=0.0, help="seconds of the fresh users sent uncounted "
                   "before their levels (the cache then holds what fresh users keep asking for, as --stream-warm-s "
                   "does for the stream; the users drawn beforehand, no drawer shares the server's cores)")
    p.add_argument("--stream", action="store_true", help="also serve each cache share again to a stream of users "
                   "without end, drawn while it is served (see above)")
    p.add_argument("--stream-warm-s", type=float, default=20.0, help="seconds of the stream sent uncounted "
                   "before its levels")
    p.add_argument("--processes", type=int, default=8, help="processes drawing the fresh users, or the stream's")
    p.add_argument("--perf-analyzer", default="", help="perf_analyzer's path: also run it on each share's repeating "
                   "users (run.sh passes it when .carry_pa is carried)")
    p.add_argument("--pa-concurrency", default="8:16:8", help="perf_analyzer's --concurrency-range")
    p.add_argument("--pa-shm", choices=["system", "cuda", "none"], default="system",
                   help="perf_analyzer's --shared-memory (the calls up to 2026-11-30 06:37 ran none)")
    p.add_argument("--pa-interval-ms", type=int, default=5000)
    p.add_argument("--pa-timeout-s", type=int, default=240)
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--tolerance", type=float, default=2e-2)
    p.add_argument("--port", type=int, default=8760)
    a = p.parse_args()
    dev = a.device
    say(f"device: {torch.cuda.get_device_name(0) if dev == 'cuda' else 'CPU'}; torch {torch.__version__}; "
        f"attention blocks {kernels.blocks()} ({kernels.BLOCKS_ENV})")
    if a.tiny:
        data = dv3_data.DataConfig.tiny(seconds_per_timestamp=3600, min_candidates=2)
        cfg = export.config()
        if a.items:
            cfg = dataclasses.replace(cfg, num_item_rows=a.items)
    else:
        data = dv3_data.DataConfig(seconds_per_timestamp=3600)
        cfg = dv3.Config(num_item_rows=a.items or 1 << 19, num_user_rows=1 << 16, dtype=torch.bfloat16,
                         attn_norm_len=1 + 16384 + 2048)
    if a.tables == "fp16":
        cfg = dataclasses.replace(cfg, table_dtype=torch.float16)
    ranker = dv3.HstuRanker(cfg).eval()
    items = served_items(cfg, a)
    if a.tables == "fp32" and items > cfg.num_item_rows:
        # the large item table holds these rows in fp16: the reference's, rounded alike, kept in
        # fp32 so that the network is exported for fp32 rows
        ranker.item_table.data = ranker.item_table.data.half().float()
    batch = dv3_data.generate_batch(data, a.requests, 1, 9 if a.tiny else None)  # None: the first inference step
    batch.hist_item_ids = batch.hist_item_ids % items
    batch.cand_item_ids = batch.cand_item_ids % items
    batch.user_ids = batch.user_ids % cfg.num_user_rows
    requests = batch.requests()
    hist = [len(r.item_ids) for r in requests]
    say(f"{len(requests)} requests: histories {min(hist)}-{max(hist)} (mean {statistics.mean(hist):.0f}), "
        f"candidates {len(requests[0].cand_item_ids)}; items {items:,} rows of {cfg.table_dim}"
        + (f" (the reference's {cfg.num_item_rows:,} repeated, fp16)" if items > cfg.num_item_rows else "")
        + f"; tables {a.tables}, the network takes {'fp16' if a.tables == 'fp16' else 'fp32'} rows")
    jobs = [feeds(r) for r in requests]
    # a large item table in memory (tmpfs), not on the disk
    shm = "/dev/shm" if items > cfg.num_item_rows and os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as repo:
        t0 = time.time()
        export.write_version(os.path.join(repo, MODEL, "1"), ranker,
                             dv3.Batch.from_requests(folded(requests[:2], cfg.num_item_rows)), device=dev)
        if items > cfg.num_item_rows:
            write_item_table(os.path.join(repo, MODEL, "1", "tables", "item_id"), ranker.item_table, items)
        say(f"tables and the {dev} package written in {time.time() - t0:.0f} s; {a.instances} instances, "
            f"max batch {a.max_batch}")
        reference = ranker.to(dev)
        fresh_jobs = []
        if a.fresh_users:
            t1 = time.time()
            users = make_users(data, cfg, items, a.fresh_users, 2, 9 if a.tiny else None, a.processes)
            fresh_jobs = [feeds(r) for r in users]
            say(f"{len(users)} fresh users drawn in {time.time() - t1:.0f} s ({a.processes} processes)")
        served = {}
        # drawing from now on, so that users are ready when the first stream level starts
        stream = UserStream(data, items, cfg.num_user_rows, 9 if a.tiny else None, a.processes) if a.stream else None
        try:
            serve_shares(a, repo, cfg, requests, jobs, reference, fresh_jobs, stream, served)
        finally:
            if stream:
                stream.close()
        best = best_eager = 0.0
        sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
        for b in sorted({1, 4, a.max_batch}):
            # compiled for this batch alone (static shapes): after a first size, a dynamic
            # recompile ran the padded reference at a quarter of its speed (H200)
            torch._dynamo.reset()
            compiled = torch.compile(reference.forward_padded, dynamic=False)
            sub = dv3.Batch.from_requests(folded(requests[:b], cfg.num_item_rows)).to(dev)
            rate = queries_per_s(compiled, sub, b, 2, 5, sync)
            best = max(best, rate)
            say(f"  reference, torch.compile (padded), batch {b}: {rate:8.1f} queries/s")
            eager = queries_per_s(reference.forward_padded, sub, b, 1, 3, sync)  # the same batch
            best_eager = max(best_eager, eager)
            say(f"  reference, eager (padded), batch {b}: {eager:8.1f} queries/s")
    for (share, fresh), top in served.items():
        say(f"served with a cache of {share}{' to fresh users' if fresh == 'fresh' else ' to the stream' if fresh else ''}, at best {top:.1f} queries/s: "
            f"{top / best:.2f}x the compiled reference's best ({best:.1f}), {top / best_eager:.2f}x the eager one's ({best_eager:.1f})")
    for fresh in ("", "fresh", "stream"):
        shares = sorted((s for s, f in served if f == fresh), key=float)
        if len(shares) > 1:
            lo, hi = served[(shares[0], fresh)], served[(shares[-1], fresh)]
            say(f"the cache of {shares[0]} against {shares[-1]}{f' ({fresh})' if fresh else ''}: "
                f"{lo / hi:.2f}x, the same call")

if __name__ == "__main__":
    main()
