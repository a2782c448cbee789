#!/usr/bin/env python3
"""MLPerf Inference's DLRM-v2 served through the real tritonserver, against the bare PyTorch
reference measured in the same call (issue 46's benchmark). Needs an NVIDIA GPU; run through
`bash bench/gpu/run.sh dlrm-v2` (carry .carry and .carry_pa), one device call at scale 1.0.

1. Tables: MLPerf DLRM-v2's 26 tables at --scale (1.0: 204 M rows, 52 GB fp16), written by
   criteo_fixture into /dev/shm unless already there (recsys/fixture.py), on a thread of its own
   while 2. runs.
2. The network: DCNv2's dense part (DLRM-v2's network) exported as a CUDA fp16 AOTInductor package
   (recsys/networks.py, the pooled rows read as fp16); meanwhile a child process compiles the
   reference's network (torch.compile at --ref-batches, --ref-compile-mode) to fill Inductor's
   on-disk caches, killed past --ref-compile-budget-s (then the default mode).
3. The repository: `dlrm_v2`, one recommender model (examples/dlrm_v2.py's config, --instances
   KIND_GPU instances, dynamic batching, GPU cache share --cache with fp16 rows, CUDA graphs);
   `dlrm_v2_lookup`, the embedding engine alone on the same store (pooled, fp16 [26, 128] out);
   `dlrm_v2_queries`, a non-batching ensemble in front of `dlrm_v2` whose requests carry their own
   number of pairs (how perf_analyzer sends queries of varying size; dlrm_v2 still batches them).
4. Exactness before timing: pooled rows of dlrm_v2_lookup against float64 sums of the fixture's
   rows, dlrm_v2's predictions against the PyTorch fp32 network on those sums.
5. perf_analyzer (gRPC, CUDA shared memory): queries of 270 pairs (-b 270 on dlrm_v2) over
   --concurrency; MLPerf-like query sizes (--mlperf-sizes, through dlrm_v2_queries) over
   --mlperf-concurrency; the lookup alone (-b 270 on dlrm_v2_lookup) over --lookup-concurrency;
   requests of --big-pairs pairs (MLPerf's Offline shape, through dlrm_v2_queries) over
   --big-concurrency; the cache's hit rate from the server's metrics. After the 270-pair runs,
   an endless stream of queries of --stream-pairs pairs (270; examples/stream_client.rs, keys in
   one CUDA pool) at --stream-concurrency, its pool as large as the cache's LRU hit rate needs
   (recsys/cache.py).
6. The bare PyTorch reference after the server stopped: fp16 tables in HBM, F.embedding_bag per
   table, the compiled network, timed with CUDA events: lookup alone, network alone, both.
7. Ratios and the issue's targets printed as PASS/MISS; the results folder (README.md, plots,
   setup.json, runs.json, perf.tgz) written by bench/gpu/dlrm_v2_report.py.

Exits non-zero when an exactness check failed or a run gave no figure (after writing results);
a target MISS is reported, not an error.
"""
import argparse
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import dlrm_v2  # noqa: E402
import dlrm_v2_report  # noqa: E402
import zipf_keys  # noqa: E402
from recsys.cache import cache_rows, lru_table, stationary_hit_rate  # noqa: E402
from recsys.fixture import SEED, TABLES, fixture_rows, prepare, synthetic_rows  # noqa: E402
from recsys.measure import device_counts, metrics_text, per_device, scrape  # noqa: E402
from recsys.gpu_busy import GpuBusy  # noqa: E402

HOT = dlrm_v2.HOTNESS
WIDTH = sum(HOT)                                   # 214 keys per pair
START = [int(x) for x in np.cumsum([0] + HOT[:-1])]  # each table's first column in `sparse`
DIM = dlrm_v2.DIM
QUERY = 270                                        # MLPerf DLRM-v2's mean pairs per query
ROW_BYTES = DIM * 2                                # an fp16 row
T0 = time.time()
PHASES = {}
# perf_analyzer's calls (--pa-modes); those over HTTP are the report's (it is imported here, not
# the other way round, to keep the report light)
PA_MODES = ("sync", "async", "grpcstream", "http", "httpsync")
HTTP_MODES = dlrm_v2_report.HTTP_MODES
NUMBER = re.compile(r"^-?[0-9.]+(e[-+]?[0-9]+)?$")


def phase(name):
    """A timestamped line per phase (flushed: a call cut off by its timeout still shows how far it got)."""
    now = time.time()
    if PHASES.get("_open"):
        last, t = PHASES["_open"]
        PHASES[last] = now - t
    PHASES["_open"] = (name, now)
    print(f"[{time.strftime('%H:%M:%S')} +{now - T0:4.0f} s] == {name}", flush=True)


def left_s(a):
    return a.budget_s - (time.time() - T0)


def stream_room_s(a):
    """Seconds a level of the endless stream needs: with every row in HBM its pool is small
    (2,048 queries) and a level takes seconds; below, the pool the LRU rate needs takes minutes."""
    return 30 if a.cache >= 1.0 else 120


# ------------------------------------------------------------------ arguments

QUICK = {"concurrency": "8,32", "mlperf_concurrency": "32", "lookup_concurrency": "32", "interval_ms": 2000,
         "stream_seconds": 3.0, "ref_batches": "17280", "ref_compile_mode": "default"}
DEFAULTS = {"concurrency": "4,8,16,32,64", "mlperf_concurrency": "16,64", "lookup_concurrency": "16,64",
            "interval_ms": 3000, "stream_seconds": 5.0, "ref_batches": "4320,17280",
            "ref_compile_mode": "max-autotune-no-cudagraphs"}


# perf_analyzer's --shared-memory kinds the runs use: GPU memory, or host memory
SHM_KINDS = ["cuda", "system"]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--perf-analyzer", required=True)
    p.add_argument("--fixture-bin", default=os.path.join(ROOT, ".carry", "criteo_fixture"))
    p.add_argument("--stream-client", default=os.path.join(ROOT, ".carry", "stream_client"),
                   help="examples/stream_client.rs (built by pack.sh); the endless stream is skipped where it is absent")
    p.add_argument("--libtorch-dir", default="")
    p.add_argument("--results", default="",
                   help="the results folder (default $OUT/dlrm-v2, with --cache below 1 $OUT/dlrm-v2-cache<percent>)")
    p.add_argument("--command", default="", help="the command line to record (run.sh passes its own)")
    p.add_argument("--work", default="/tmp/dlrm_v2", help="repository, package, key pools, raw CSVs, server log")
    p.add_argument("--fixture", default="", help="the tables' folder (default /dev/shm/criteo_s<scale>_d128 if it has room)")
    p.add_argument("--scale", type=float, default=1.0, help="MLPerf's rows times this (1.0: 204 M rows, 52 GB fp16)")
    p.add_argument("--cache", type=float, default=1.0, help="gpucacheper: the GPU cache's share of the rows (1.0: all in HBM)")
    p.add_argument("--allocation", default="", choices=["", "store", "per_table", "lookups"],
                   help="gpucache_allocation (default: per_table at --cache 1, each table's rows exactly; store below, "
                        "the small tables whole; lookups: as store, the large tables' slots by their keys a pair)")
    p.add_argument("--instances", type=int, default=2, help="dlrm_v2's KIND_GPU instances (one cache per GPU, shared)")
    p.add_argument("--placement", default="replicated", choices=["replicated", "sharded"],
                   help="gpucache_placement: each GPU its own copy of every row, or the tables spread over the GPUs "
                        "(every GPU's lookup reading its peers' tables)")
    p.add_argument("--replicate-share", default="0.35",
                   help="gpucache_sharded_replicate (with --placement sharded): the share of each GPU's room the "
                        "tables with the most lookups a byte take together, copied to every GPU; 0 places every table once")
    p.add_argument("--sharded-memory-gb", default="0",
                   help="gpucache_sharded_memory_gb (with --placement sharded): the most GB of rows the plan puts on "
                        "each GPU (0: each GPU's free memory less 15%%); 71 makes an H100 80GB's plan on larger GPUs")
    p.add_argument("--cache-rows", default="fp16", choices=["fp16", "fp32"],
                   help="gpucache_row_type: how the GPUs keep the rows (fp32: 104 GB at scale 1.0, more than one GPU holds)")
    p.add_argument("--gpus", default="", help="the GPUs of the instance groups, e.g. 0 or 0,1 (--instances on each, every "
                   "row in each GPU's HBM: replicated); default: every GPU the server sees. Clients' inputs stay on "
                   "GPU 0; per-GPU rates from rust_device_inferences_total")
    p.add_argument("--max-queue-delay-us", type=int, default=200)
    p.add_argument("--max-batch", type=int, default=16384, help="max_batch_size of dlrm_v2 and dlrm_v2_lookup, in pairs")
    p.add_argument("--graph-batches", default="auto",
                   help="CUDA graphs of the network: auto (powers of two to 1024, then steps of 2048 to --max-batch), "
                        "pow2 (the backend's buckets: powers of two), a list of batch sizes, or off")
    p.add_argument("--network-precision", default="fp16", choices=["fp16", "fp8"],
                   help="the package's network: fp16, or its large linear layers in FP8 e4m3 (examples/fp8.py, "
                        "per-tensor scales, the inputs' calibrated on examples/dlrm_v2.calibration_inputs)")
    p.add_argument("--dcnv2-cross", default="torch", choices=["torch", "triton"],
                   help="the package's cross layers as written, or our Triton kernel (examples/triton_kernels.py)")
    p.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                   help="an Inductor setting for the package's export (repeatable)")
    p.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of every table's keys")
    p.add_argument("--concurrency", default=None, help=f"270-pair queries in flight (default {DEFAULTS['concurrency']})")
    p.add_argument("--mlperf-sizes", default="100-700",
                   help="pairs per query of the MLPerf-like runs: LO-HI (uniform over LO..HI) or a list to draw from "
                        "uniformly, e.g. 100,150,200,250,300,400,700")
    p.add_argument("--mlperf-queries", type=int, default=256, help="distinct queries in the MLPerf-like pool")
    p.add_argument("--mlperf-concurrency", default=None,
                   help=f"queries in flight of the MLPerf-like runs (default {DEFAULTS['mlperf_concurrency']}); 0: none")
    p.add_argument("--lookup-concurrency", default=None,
                   help=f"270-pair requests in flight to dlrm_v2_lookup (default {DEFAULTS['lookup_concurrency']}); 0: none")
    p.add_argument("--pool-samples", type=int, default=1081,
                   help="-b 270 runs: perf_analyzer's pool of single pairs (it sends pairs i..i+269 of it from step "
                        "i = 270 k mod N and holds N x 270 pairs in GPU memory, so N is modest; coprime with 270, every "
                        "offset is used)")
    p.add_argument("--pa-modes", default="sync",
                   help="perf_analyzer's calls, a comma list of sync, async, grpcstream, http and httpsync: each measured run once "
                        "per mode, one after the other on the same server (sync: a thread and a connection per "
                        "request in flight, perf_analyzer's default; async: --async, --pa-threads threads keep them "
                        "in flight; grpcstream: --async --streaming, each client context's requests on one open "
                        "gRPC stream, which Triton 2.51 reads with its own thread and completion queue instead of "
                        "the unary handler's two (one H100 call: the warm-up at 384 in flight did not finish in "
                        "296 s); http: async calls over HTTP, whose front end has "
                        "--http-thread-count workers; httpsync: sync calls over HTTP, a thread and a connection per "
                        "request in flight). One H100, 2026-11-27: async and grpcstream gave no more than "
                        "sync and failed more runs, http a quarter (bench/gpu/results/dlrm-v2/front_end/README.md); "
                        "2026-11-28: httpsync a quarter too, perf_analyzer at 9.5 of 16 cores (dlrm-v2/offline/)")
    p.add_argument("--big-pairs", type=int, default=8192,
                   help="the pairs of one request in the --big-concurrency runs (at most --max-batch)")
    p.add_argument("--big-concurrency", default="0",
                   help="requests of --big-pairs pairs each in flight, sent through dlrm_v2_queries (the twin; "
                        "perf_analyzer -b 1, each step a whole request): MLPerf's Offline shape, where the system "
                        "batches the samples as it likes, so the queries a second through the front end do not "
                        "hold the rate (0: none)")
    p.add_argument("--big-queries", type=int, default=16,
                   help="distinct requests in the --big-concurrency runs' pool, each of --big-pairs distinct pairs "
                        "(GPU memory: this x --big-pairs x 1,764 bytes, 231 MB at 16 x 8192). perf_analyzer -b B "
                        "on a pool of single pairs would keep B pairs for every step of it, 15.6 GB for 1,081 "
                        "steps at 8192: that is what ran out of memory on an H100 "
                        "(bench/gpu/results/dlrm-v2/front_end/)")
    p.add_argument("--probe-clients", default="",
                   help="one-pair queries again from this many perf_analyzer processes at once (a comma list, e.g. "
                        "1,2,4), --probe-concurrency split among them, inputs in the requests' bodies (two processes "
                        "cannot share a server's shared memory): whether the client or the server sets the queries/s")
    p.add_argument("--pa-timeout-s", type=float, default=200.0,
                   help="one perf_analyzer run's limit: past it the run is stopped and gives no figure")
    p.add_argument("--probe-concurrency", default="0",
                   help="one-pair queries (perf_analyzer -b 1 on dlrm_v2) in flight, in each of --pa-modes: the "
                        "queries/s the server gives when the GPU has next to nothing to do (0: none)")
    p.add_argument("--pa-channel-shares", default="",
                   help="gRPC calls of perf_analyzer that share one connection (its client library's "
                        "TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT, default 6: 512 in flight open 86 connections), a "
                        "comma list: each 270-pair run once per value, one after the other on the same server")
    p.add_argument("--pa-shm", default="cuda", choices=SHM_KINDS,
                   help="where perf_analyzer's gRPC and HTTP runs put their inputs: CUDA shared memory (GPU "
                        "memory, as a client on the GPU's host can) or system shared memory (host memory: the "
                        "backend copies the keys up, as for keys sent in a request's body)")
    p.add_argument("--capi-concurrency", default="0",
                   help="270-pair queries in flight through Triton's C API (perf_analyzer --service-kind "
                        "triton_c_api: Triton's library and this backend in perf_analyzer's own process, the same "
                        "repository, no gRPC front end), a comma list (one value or an even step), after the "
                        "server stops; inputs in --capi-shm. 0: none")
    p.add_argument("--capi-shm", default="cuda", choices=SHM_KINDS,
                   help="where the C API runs' inputs lie: cuda (GPU memory, as the gRPC runs send them; "
                        "perf_analyzer hands the server its device pointers) or system (host memory: the backend "
                        "copies them up, as it does a network client's)")
    p.add_argument("--capi-dir", default="",
                   help="--capi-concurrency's --triton-server-directory: lib/libtritonserver.so and backends/ (run.sh "
                        "makes /tmp/capi)")
    p.add_argument("--pa-threads", type=int, default=0,
                   help="perf_analyzer's --max-threads with async calls (0: its default, 16)")
    p.add_argument("--interval-ms", type=int, default=None, help=f"perf_analyzer's window (default {DEFAULTS['interval_ms']})")
    p.add_argument("--stream-concurrency", default="32", help="the endless stream's queries in flight; 0: no stream")
    p.add_argument("--stream-pairs", type=int, default=QUERY,
                   help="pairs of one endless-stream request (default 270, MLPerf's mean query; larger: MLPerf's "
                        "Offline shape, as --big-pairs)")
    p.add_argument("--stream-gb", type=float, default=24.0, help="the endless stream's key pool: at most this many GB")
    p.add_argument("--stream-seconds", type=float, default=None,
                   help=f"the endless stream: seconds measured per level, at least one pass of the pool "
                        f"(default {DEFAULTS['stream_seconds']})")
    p.add_argument("--stream-fresh", action="store_true",
                   help="the endless stream's pool drawn again (new keys, the same law) before each pass, so no query "
                        "repeats: the measured rate is the policy's on an endless stream, not on a repeating pool "
                        "(which a frequency-keeping cache would learn)")
    p.add_argument("--stream-warm-passes", type=int, default=1,
                   help="passes of the pool before the measured ones (the cache filling; LFU's counts growing)")
    p.add_argument("--cache-policy", default="lru", choices=["lru", "lfu"],
                   help="gpucache_policy: which key a full cache set gives up (lfu: the least frequent, and a missed "
                        "key goes in only once it is looked up more often)")
    p.add_argument("--miss-reads", default="cpu", choices=["cpu", "gpu", "both"],
                   help="gpucache_miss_reads: who reads the cache's misses from host memory (gpu: the lookup's "
                        "kernel, in place over PCIe)")
    p.add_argument("--host-memory", default="mapped", choices=["auto", "mapped", "huge_pages"],
                   help="host_memory: the host tier's rows read in place from the fixture's files, or copied at "
                        "load into memory of 2 MiB pages (52 GB more RAM at scale 1.0)")
    p.add_argument("--pipeline-parts", type=int, default=1,
                   help="recommender_pipeline_parts: a batch runs in this many parts, the lookup of one (its misses "
                        "read below the cache) beside the network on the part before")
    p.add_argument("--cache-state-dir", default="",
                   help="cache_state_dir: the caches save the keys they hold there (at unload and every "
                        "--cache-state-period-s) and a new server's caches load them at start (warm restarts)")
    p.add_argument("--cache-state-period-s", type=float, default=15.0, help="cache_state_period_s")
    p.add_argument("--hit-rate-bound", type=float, default=0.002)
    p.add_argument("--ref-batches", default=None,
                   help=f"the reference's batches in pairs (default {DEFAULTS['ref_batches']}: 270 x 16 and x 64)")
    p.add_argument("--ref-compile-mode", default=None,
                   help=f"torch.compile's mode for the reference's network (default {DEFAULTS['ref_compile_mode']})")
    p.add_argument("--ref-compile-budget-s", type=float, default=200.0,
                   help="the reference's compile (a child process beside the fixture write and the export) is killed "
                        "past this many seconds from the start and the default mode used instead (printed)")
    p.add_argument("--no-reference", action="store_true", help="skip the bare PyTorch reference")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="the fp16 tensor peak the network's TFLOP/s is compared with (H100 SXM, dense: 989)")
    p.add_argument("--exact-requests", type=int, default=16,
                   help="requests of 270 pairs checked before the timed runs (sent at once: every GPU's instances answer some)")
    p.add_argument("--lookup-rtol", type=float, default=2e-3)
    p.add_argument("--lookup-atol", type=float, default=1e-3)
    p.add_argument("--prediction-bound", type=float, default=None,
                   help="dlrm_v2's predictions against the PyTorch fp32 network: max abs diff (default 2e-3 with the "
                        "fp16 network, 5e-2 with fp8: bench/gpu/results/dlrm-v2-network measured 1.8e-2 eager)")
    p.add_argument("--budget-s", type=float, default=530.0,
                   help="perf_analyzer runs that would start past this many seconds minus the reference's share "
                        "are skipped (printed); the device call's limit is 600 s")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="a tritonserver option for this run, e.g. --server-arg=--http-thread-count=32 (repeatable; "
                        "recorded in setup.json)")
    p.add_argument("--port", type=int, default=18950)
    p.add_argument("--cuda-pool-gb", type=int, default=2, help="tritonserver --cuda-memory-pool-byte-size for GPU 0")
    p.add_argument("--verbose", action="store_true", help="server --log-verbose=1 (the backend's timing lines among "
                                                                   "Triton's own, which slow its request handling)")
    p.add_argument("--timing", action="store_true",
                   help="the backend's timing lines alone (TRITON_RUST_TIMING=1, no --log-verbose), summarised per "
                        "perf_analyzer run")
    p.add_argument("--quick", action="store_true",
                   help="fewer points: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    a = p.parse_args(argv)
    for k, v in DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, QUICK[k] if a.quick else v)
    a.allocation = a.allocation or ("per_table" if a.cache >= 1.0 else "store")
    if a.prediction_bound is None:
        a.prediction_bound = 5e-2 if a.network_precision == "fp8" else 2e-3
    ints = lambda s: [int(x) for x in str(s).split(",") if x.strip() and int(x) > 0]  # noqa: E731
    a.concs, a.mlperf_concs, a.lookup_concs = ints(a.concurrency), ints(a.mlperf_concurrency), ints(a.lookup_concurrency)
    a.stream_levels, a.ref_batch_list = ints(a.stream_concurrency), ints(a.ref_batches)
    a.pa_mode_list = [m.strip() for m in a.pa_modes.split(",") if m.strip()]
    if not a.pa_mode_list or any(m not in PA_MODES for m in a.pa_mode_list):
        p.error(f"--pa-modes: a comma list of {', '.join(PA_MODES)}, not {a.pa_modes!r}")
    a.probe_concs = ints(a.probe_concurrency)
    a.channel_shares = ints(a.pa_channel_shares)
    a.capi_concs = ints(a.capi_concurrency)
    if a.capi_concs and not a.capi_dir:
        p.error("--capi-concurrency needs --capi-dir (lib/libtritonserver.so and backends/)")
    if a.capi_concs:
        try:
            capi_range(a.capi_concs)
        except ValueError as e:
            p.error(str(e))
    a.probe_client_counts = ints(a.probe_clients)
    a.big_concs = ints(a.big_concurrency)
    if a.big_concs and not 0 < a.big_pairs <= a.max_batch:
        p.error(f"--big-pairs must be 1..--max-batch ({a.max_batch})")
    if a.big_concs and a.big_queries < 1:
        p.error("--big-queries must be at least 1")
    if not 0 < a.stream_pairs <= a.max_batch:
        p.error(f"--stream-pairs must be 1..--max-batch ({a.max_batch})")
    if a.pool_samples % 2 == 0 or a.pool_samples % 3 == 0 or a.pool_samples % 5 == 0:
        p.error("--pool-samples must be coprime with 270 (not a multiple of 2, 3 or 5)")
    if not a.results:
        name = "dlrm-v2" if a.cache >= 1.0 else f"dlrm-v2-cache{round(a.cache * 100)}"
        a.results = os.path.join(os.environ.get("OUT", "/tmp/out"), name)
    a.command = a.command or " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    return a


def graph_batches(spec, max_batch):
    """The batch sizes the network's CUDA graphs are captured for ([] for off, None for the
    backend's powers of two). Finer than powers of two above 1024: a batch runs padded to its
    graph's size, and 8200 pairs padded to 16384 would double the network's work."""
    if spec == "off":
        return []
    if spec == "pow2":
        return None
    if spec == "auto":
        sizes = [1 << i for i in range(11) if 1 << i < max_batch]
        sizes += list(range(2048, max_batch, 2048))
        return sorted(set(sizes + [max_batch]))
    return sorted({int(x) for x in spec.split(",")})


def mlperf_sizes(spec, rng, n):
    """`n` query sizes in pairs: LO-HI uniform over LO..HI, or drawn uniformly from a list."""
    if "-" in spec:
        lo, hi = (int(x) for x in spec.split("-"))
        return rng.integers(lo, hi + 1, size=n), f"uniform over {lo}..{hi} pairs (mean {(lo + hi) / 2:.0f})"
    choices = np.array([int(x) for x in spec.split(",")])
    return rng.choice(choices, size=n), f"drawn uniformly from {list(map(int, choices))} (mean {choices.mean():.0f})"


# ------------------------------------------------------------------ the cache's hit rates

def cache_plan(rows, share, allocation, alpha, bound):
    """Per table: rows, cache slots, hotness, the stationary hit rate (the hottest keys cached),
    an LRU cache's rate on the endless stream (Che) and its characteristic time T (lookups).
    Weighted by hotness (every pair looks up HOT[t] keys of table t, so the server's hit rate,
    hits over keys of all tables, weighs each table so). `need_pairs`: the pairs an endless
    stream's pool must hold for its measured rate to be the LRU rate (pool_plan's 2 T on every
    table whose misses count, here T / HOT[t] pairs per T lookups)."""
    cached = cache_rows(rows, share, allocation, HOT)
    tables = []
    for n, c, h in zip(rows, cached, HOT):
        t_char, lru = lru_table(n, c, alpha)
        tables.append({"rows": n, "cached": c, "hotness": h, "stationary": stationary_hit_rate([n], [c], alpha),
                       "lru": lru, "T": t_char})
    weighted = lambda key: sum(t["hotness"] * t[key] for t in tables) / WIDTH  # noqa: E731
    counted = [t for t in tables if t["T"] != float("inf") and t["hotness"] * (1 - t["lru"]) / WIDTH > bound / 10]
    need = max((2 * t["T"] / t["hotness"] for t in counted), default=0.0)
    return {"cached_per_table": cached, "stationary": weighted("stationary"), "lru": weighted("lru"),
            "need_pairs": need, "tables": [{k: (None if v == float("inf") else v) for k, v in t.items()} for t in tables]}


def expected_pool_rate(plan, pairs):
    """The rate a cyclic pool of `pairs` pairs measures: a table whose pool lookups reach 2 T has
    the LRU rate, a smaller one fits in the cache whole and hits (recsys/cache.py's pool_plan)."""
    rates = [t["lru"] if t["T"] is not None and pairs * t["hotness"] >= 2 * t["T"] else 1.0 for t in plan["tables"]]
    return sum(h * r for h, r in zip(HOT, rates)) / WIDTH


# ------------------------------------------------------------------ keys

def draw_pairs(rows, n, alpha, seed):
    """`n` pairs: sparse int64 [n, 214], every bag full, each table's keys Zipf over its rows
    (zipf_keys' law and rank-to-key map); dense float32 [n, 13]."""
    rng = np.random.default_rng(seed)
    sparse = np.empty((n, WIDTH), np.int64)
    for t, (r, h) in enumerate(zip(rows, HOT)):
        sparse[:, START[t]:START[t] + h] = zipf_keys.spread(zipf_keys.zipf_ranks(rng, r, alpha, n * h), r).reshape(n, h)
    return sparse, rng.random((n, 13), dtype=np.float32)


def write_pool(path, steps):
    """perf_analyzer's --input-data JSON: one step per dict of {input: array} (its shape is the
    array's: one pair [214] for a batching model, a whole query [n, 214] for the twin)."""
    with open(path + ".tmp", "w") as f:
        f.write('{"data": [')
        for i, step in enumerate(steps):
            f.write(("," if i else "") + json.dumps(
                {k: {"b64": zipf_keys.b64(v), "shape": list(v.shape)} for k, v in step.items()}))
        f.write("]}")
    os.replace(path + ".tmp", path)
    return path


def pools(a, rows, setup):
    """The key pools perf_analyzer cycles: {name: (file, description)}."""
    out = {}
    os.makedirs(a.work, exist_ok=True)
    s, d = draw_pairs(rows, a.pool_samples, a.alpha, seed=270)
    out["fixed270"] = (write_pool(os.path.join(a.work, "pool_pairs.json"),
                                  ({"sparse": s[i], "dense": d[i]} for i in range(len(s)))),
                       f"-b 270 runs: {a.pool_samples} distinct pairs, each query 270 consecutive ones of them "
                       f"({a.pool_samples * WIDTH:,} lookups per cycle)")
    out["lookup"] = (write_pool(os.path.join(a.work, "pool_keys.json"), ({"KEYS": s[i]} for i in range(len(s)))),
                     out["fixed270"][1])
    rng = np.random.default_rng(700)
    sizes, note = mlperf_sizes(a.mlperf_sizes, rng, a.mlperf_queries)
    s, d = draw_pairs(rows, int(sizes.sum()), a.alpha, seed=700)
    at = np.concatenate([[0], np.cumsum(sizes)])
    out["mlperf"] = (write_pool(os.path.join(a.work, "pool_mlperf.json"),
                                ({"sparse": s[at[i]:at[i + 1]], "dense": d[at[i]:at[i + 1]]} for i in range(len(sizes)))),
                     f"MLPerf-like runs: {len(sizes)} distinct queries, {int(sizes.sum()):,} pairs")
    setup["mlperf_mean_pairs"] = float(sizes.mean())
    setup["mlperf_sizes_note"] = (f"{note}, a pool of {len(sizes)} queries (mean {sizes.mean():.1f} pairs) — an "
                                  "approximation of MLPerf's 100-700 pairs per query (its mean is about 270)")
    s, d = draw_pairs(rows, 128 * QUERY, a.alpha, seed=271)
    out["fixed270_ensemble"] = (write_pool(os.path.join(a.work, "pool_queries270.json"),
                                           ({"sparse": s[i * QUERY:(i + 1) * QUERY], "dense": d[i * QUERY:(i + 1) * QUERY]}
                                            for i in range(128))),
                                "270-pair queries through the twin: 128 distinct queries")
    if a.big_concs:
        s, d = draw_pairs(rows, a.big_queries * a.big_pairs, a.alpha, seed=8192)
        b = a.big_pairs
        out["big"] = (write_pool(os.path.join(a.work, "pool_big.json"),
                                 ({"sparse": s[i * b:(i + 1) * b], "dense": d[i * b:(i + 1) * b]}
                                  for i in range(a.big_queries))),
                      f"large requests through the twin: {a.big_queries} distinct requests of {b} pairs")
    with open(os.path.join(a.work, "pools.txt"), "w") as f:
        f.write("\n".join(f"{k}: {v[1]}" for k, v in out.items()) + "\n" + setup["mlperf_sizes_note"] + "\n")
    setup["pools"] = {k: v[1] for k, v in out.items()}
    return out


# ------------------------------------------------------------------ the repository

def param(key, value):
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'


def replace_once(text, old, new):
    # examples/dlrm_v2.config is the model's config; a change there must not go unnoticed here
    assert text.count(old) == 1, f"examples/dlrm_v2.config no longer holds {old!r}"
    return text.replace(old, new)


def write_repository(a, repo, fixture, package, graphs):
    """dlrm_v2 (the recommender), dlrm_v2_lookup (the embedding engine alone on the same store)
    and dlrm_v2_queries (the non-batching twin in front of dlrm_v2)."""
    shutil.rmtree(repo, ignore_errors=True)
    store = [param("sparse_files", ",".join(os.path.join(fixture, f"t{i}") for i in range(TABLES))),
             param("gpucacheper", a.cache), param("gpucache_allocation", a.allocation),
             # one cache per GPU for both instances (two copies would not fit at --cache 1.0)
             param("gpucache_sharing", "device"), param("gpucache_row_type", a.cache_rows),
             param("gpucache_policy", a.cache_policy), param("gpucache_miss_reads", a.miss_reads),
             param("gpucache_placement", a.placement), param("gpucache_sharded_replicate", a.replicate_share),
             param("gpucache_sharded_memory_gb", a.sharded_memory_gb),
             # both models open one store: the rows are in memory once
             param("store_name", os.path.basename(os.path.normpath(fixture))), param("host_memory", a.host_memory)]
    if a.cache_state_dir:  # warm restarts: the caches' keys saved there and loaded at start
        store += [param("cache_state_dir", a.cache_state_dir), param("cache_state_period_s", a.cache_state_period_s)]
    on = f" gpus: [ {', '.join(a.gpus.split(','))} ]" if a.gpus else ""
    group = f"instance_group [ {{ count: {a.instances} kind: KIND_GPU{on} }} ]"
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {a.max_queue_delay_us} }}"

    text = dlrm_v2.config("dlrm_v2", a.max_batch, "KIND_GPU", "dense.pt2")
    text = replace_once(text, "dynamic_batching { max_queue_delay_microseconds: 100 }", batching)
    text = replace_once(text, "instance_group [ { count: 1 kind: KIND_GPU } ]", group)
    if graphs is None:
        text += "optimization { cuda { graphs: true } }\n"
    elif graphs:
        text += ("optimization { cuda { graphs: true graph_spec [ "
                 + ", ".join(f"{{ batch_size: {b} }}" for b in graphs) + " ] } }\n")
    text += "\n".join(store + [param("recommender_embeddings_type", "TYPE_FP16"),
                               param("recommender_pipeline_parts", a.pipeline_parts)]) + "\n"
    os.makedirs(os.path.join(repo, "dlrm_v2", "1"))
    shutil.copyfile(package, os.path.join(repo, "dlrm_v2", "1", "dense.pt2"))
    with open(os.path.join(repo, "dlrm_v2", "config.pbtxt"), "w") as f:
        f.write(text)

    lookup = ['name: "dlrm_v2_lookup"', 'backend: "rust"', f"max_batch_size: {a.max_batch}",
              f'input [ {{ name: "KEYS" data_type: TYPE_INT64 dims: [ {WIDTH} ] }} ]',
              f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP16 dims: [ {TABLES}, {DIM} ] }} ]', batching, group,
              param("engine", "embedding"), param("embedding_interface", "pooled"),
              param("embedding_table_names", ",".join(f"t{i}" for i in range(TABLES))),
              param("embedding_vecsize_per_table", DIM), param("embedding_hotness_per_table", ",".join(map(str, HOT))),
              param("embedding_combiner", "sum"), param("default_value_for_each_table", 0), *store]
    os.makedirs(os.path.join(repo, "dlrm_v2_lookup", "1"))
    with open(os.path.join(repo, "dlrm_v2_lookup", "config.pbtxt"), "w") as f:
        f.write("\n".join(lookup) + "\n")

    # Triton's ensembles accept a non-batching tensor [-1, d] for a batching model's [d]: a
    # query of n pairs reaches dlrm_v2 as a request of batch n, batched with the others there
    twin = ['name: "dlrm_v2_queries"', 'platform: "ensemble"', "max_batch_size: 0",
            'input [ { name: "dense" data_type: TYPE_FP32 dims: [ -1, 13 ] },',
            f'        {{ name: "sparse" data_type: TYPE_INT64 dims: [ -1, {WIDTH} ] }} ]',
            'output [ { name: "prediction" data_type: TYPE_FP32 dims: [ -1, 1 ] } ]',
            'ensemble_scheduling { step [ { model_name: "dlrm_v2" model_version: -1 '
            'input_map { key: "dense" value: "dense" } input_map { key: "sparse" value: "sparse" } '
            'output_map { key: "prediction" value: "prediction" } } ] }']
    os.makedirs(os.path.join(repo, "dlrm_v2_queries", "1"))
    with open(os.path.join(repo, "dlrm_v2_queries", "config.pbtxt"), "w") as f:
        f.write("\n".join(twin) + "\n")


# ------------------------------------------------------------------ exactness

def calibration(a):
    """The FP8 network's calibration inputs (examples/dlrm_v2.py), None for fp16."""
    return dlrm_v2.calibration_inputs() if a.network_precision == "fp8" else None


def pooled_float64(sparse):
    """Each pair's bags summed in float64 from the fixture's rows (recomputed from its seed): [n, 26, 128]."""
    n = len(sparse)
    out = np.empty((n, TABLES, DIM), np.float64)
    for t, h in enumerate(HOT):
        keys = sparse[:, START[t]:START[t] + h].reshape(-1)
        out[:, t] = synthetic_rows(SEED, t, keys, DIM).reshape(n, h, DIM).astype(np.float64).sum(1)
    return out


def exactness(a, rows, failures):
    """dlrm_v2_lookup's pooled rows against float64 sums, dlrm_v2's predictions against the
    PyTorch fp32 network (the weights the package was exported from) on those sums."""
    import torch
    from recsys.networks import dense_network
    ref32 = dense_network("dcnv2", "fp32", "cuda")
    ref16 = dense_network("dcnv2", a.network_precision, "cuda", cross=a.dcnv2_cross,
                          calibration=calibration(a))  # the exported module itself
    from concurrent.futures import ThreadPoolExecutor
    from kserve_client import Client
    sparse, dense = draw_pairs(rows, a.exact_requests * QUERY, a.alpha, seed=46)
    want = pooled_float64(sparse)
    worst = bad = 0
    worst32 = worst16 = 0.0
    text = metrics_text(a.port)
    before = {m: device_counts(a.port, m, text) for m in ("dlrm_v2_lookup", "dlrm_v2")}

    def ask(i):
        # every request from a client of its own, all at once: Triton spreads them over the
        # instances, so the instances of every GPU answer some (printed below)
        sl = slice(i * QUERY, (i + 1) * QUERY)
        c = Client(f"localhost:{a.port}")
        try:
            got = c.infer("dlrm_v2_lookup", {"KEYS": sparse[sl]}, ["OUTPUT0"])["OUTPUT0"].astype(np.float64)
            pred = c.infer("dlrm_v2", {"dense": dense[sl], "sparse": sparse[sl]}, ["prediction"])["prediction"]
        finally:
            c.close()
        return got, pred

    with ThreadPoolExecutor(max_workers=min(32, a.exact_requests)) as pool:
        answers = list(pool.map(ask, range(a.exact_requests)))
    time.sleep(0.6)  # one publishing interval of the backend's metrics
    text = metrics_text(a.port)
    served = {m: per_device(before[m], device_counts(a.port, m, text), 1.0) for m in before}
    print("  exactness requests answered per GPU (share of inferences): " + "; ".join(
        f"{m} " + ", ".join(f"{d} {v:.2f}" for d, v in sorted(shares.items())) for m, shares in served.items()),
        flush=True)
    for i, (got, pred) in enumerate(answers):
        sl = slice(i * QUERY, (i + 1) * QUERY)
        diff = np.abs(got - want[sl])
        bad += int((diff > a.lookup_atol + a.lookup_rtol * np.abs(want[sl])).sum())
        worst = max(worst, float(diff.max()))
        with torch.no_grad():
            d = torch.from_numpy(dense[sl]).cuda()
            p = torch.from_numpy(want[sl]).float().cuda()
            w32 = ref32(d, p).cpu().numpy()
            w16 = ref16(d, p).cpu().numpy()
        worst32 = max(worst32, float(np.abs(pred - w32).max()))
        worst16 = max(worst16, float(np.abs(pred - w16).max()))
    lookup = {"requests": a.exact_requests, "pooled_rows": a.exact_requests * QUERY * TABLES, "max_abs_diff": worst,
              "bad_values": bad, "rtol": a.lookup_rtol, "atol": a.lookup_atol, "per_gpu": served}
    pred = {"predictions": a.exact_requests * QUERY, "max_abs_diff_fp32": worst32, "max_abs_diff_fp16": worst16,
            "bound": a.prediction_bound}
    print(f"  dlrm_v2_lookup: {lookup['pooled_rows']:,} pooled rows ({a.exact_requests} requests of 270 pairs, full bags) "
          f"against float64 sums of the fixture's rows: max abs diff {worst:.3g}; bound |diff| <= {a.lookup_atol} + "
          f"{a.lookup_rtol} x |sum| (fp16 rounding of the result): {bad} values outside", flush=True)
    print(f"  dlrm_v2: {pred['predictions']:,} predictions against the PyTorch fp32 network on those sums: max abs diff "
          f"{worst32:.3g} (bound {a.prediction_bound}); against the {a.network_precision} network the package was "
          f"exported from: "
          f"{worst16:.3g}", flush=True)
    if bad:
        failures.append(f"dlrm_v2_lookup: {bad} pooled values outside {a.lookup_atol} + {a.lookup_rtol} x |sum| "
                        f"(max abs diff {worst:.3g})")
    if not worst32 <= a.prediction_bound:
        failures.append(f"dlrm_v2: predictions {worst32:.3g} from the PyTorch fp32 reference (bound {a.prediction_bound})")
    del ref32, ref16
    torch.cuda.empty_cache()
    return {"lookup": lookup, "prediction": pred}


# ------------------------------------------------------------------ perf_analyzer

def server_stats(client, model):
    st = client.stats(model)
    s = st["inference_stats"]
    return {"inferences": int(st.get("inference_count", 0)), "executions": int(st.get("execution_count", 0)),
            "requests": int(s["success"]["count"]),
            **{k: int(s[k]["ns"]) for k in ("queue", "compute_input", "compute_infer", "compute_output")}}


def read_rows(raw):
    """The rows of a perf_analyzer CSV (one per concurrency), as numbers."""
    with open(raw) as f:
        return [{k: float(v) for k, v in row.items() if k and v not in ("", None) and NUMBER.match(v)}
                for row in csv.DictReader(f)]


def read_row(raw):
    """The first row of a perf_analyzer CSV, as numbers."""
    return read_rows(raw)[0]


CONNECTION_LOST = re.compile(r"Broken pipe|Connection reset by peer|failed to connect to all addresses|"
                             r"Failed to retrieve results from inference request")


def pa_call(a, cmd, env=None, limit=None):
    """perf_analyzer's run, stopped after `limit` seconds (default --pa-timeout-s, or what is
    left of the budget): one that hangs gives no figure (a failed run) instead of taking the
    rest of the call."""
    limit = limit or min(a.pa_timeout_s, max(60, left_s(a)))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"perf_analyzer stopped after {limit:.0f} s")


def pa_env(share):
    """perf_analyzer's environment: `share` gRPC calls to a connection (None: its default)."""
    if share is None:
        return None
    return {**os.environ, "TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": str(share)}


def pa_command(a, model, batch, conc, data, raw, mode):
    """perf_analyzer's command line for one run in `mode` (one of PA_MODES): gRPC on the port
    after --port, HTTP on --port; sync calls hold a thread a request in flight, the async modes
    --pa-threads threads."""
    http = mode in HTTP_MODES
    cmd = [a.perf_analyzer, "-m", model, "-b", str(batch), "--concurrency-range", f"{conc}:{conc}",
           "-i", "http" if http else "grpc", "-u", f"localhost:{a.port if http else a.port + 1}",
           "--shared-memory", a.pa_shm, "--output-shared-memory-size", str(1 << 20),
           "--input-data", data, "--measurement-interval", str(a.interval_ms), "--max-trials", "6", "-f", raw]
    if mode == "grpcstream":
        cmd.append("--streaming")
    if mode in ("async", "grpcstream", "http"):
        cmd.append("--async")
        if a.pa_threads:
            cmd += ["--max-threads", str(a.pa_threads)]
    return cmd


def perf_run(a, client, kind, model, batch, conc, data, pairs_per_query, runs, failures, mode=None, share=None):
    """One perf_analyzer run (--pa-shm's shared memory), printed and appended to `runs` (and
    runs.json); None where it gave no figure. `batch`: -b (270, or 1 for the twin, whose steps
    carry their own rows); `pairs_per_query`: pairs of one request (the twin: its pool's mean);
    `mode`: one of --pa-modes' calls, gRPC sync or async, the gRPC stream, or HTTP async or sync
    (default: the first of --pa-modes); `share`: gRPC calls to a connection (--pa-channel-shares; None: perf_analyzer's
    default). A run that loses its connections is run once more.
    One perf_analyzer process: two at once cannot share a server with shared memory, since each
    unregisters every region of the server when it starts and when it ends."""
    mode = mode or a.pa_mode_list[0]
    raw = os.path.join(a.work, "raw", f"{kind}_c{conc}_{mode}" + ("" if share is None else f"_share{share}") + ".csv")
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    if os.path.exists(raw):
        os.remove(raw)
    cmd = pa_command(a, model, batch, conc, data, raw, mode)
    stats_model = "dlrm_v2_lookup" if kind == "lookup" else "dlrm_v2"

    def counts():
        """The server's counts, the host's CPU and the time, as a run starts."""
        text = metrics_text(a.port)
        return (*scrape(a.port, stats_model, text), device_counts(a.port, stats_model, text),
                server_stats(client, stats_model), cpu_sample(a), time.time())

    time.sleep(0.6)  # the backend publishes its metrics every 250 ms: the last phase's lookups all counted
    log_at = log_size(a)
    k0, h0, d0, s0, c0, t0 = counts()
    env = pa_env(share)
    done = pa_call(a, cmd, env)
    retried = False
    if done.returncode != 0 and CONNECTION_LOST.search(done.stdout + done.stderr) and left_s(a) > 60:
        # perf_analyzer's gRPC connections break at times with hundreds in flight ("Broken pipe",
        # model_analyzer#357): the run once more, its counts taken afresh
        print(f"  ({kind} c={conc} {mode}: perf_analyzer lost connections; the run once more)", flush=True)
        retried = True
        k0, h0, d0, s0, c0, t0 = counts()
        done = pa_call(a, cmd, env)
    stability = 10  # perf_analyzer's default bound (%) on how far its last windows may differ
    # unstable windows: longer ones and a looser bound, twice at most (as recsys/measure.py does)
    for factor, looser in ((2, 25), (4, 50)):
        if done.returncode == 0 or "stable" not in done.stdout + done.stderr or left_s(a) < 60:
            break
        print(f"  ({kind} c={conc}: unstable at -s {stability}; again with {factor * a.interval_ms} ms windows, -s {looser})",
              flush=True)
        retry = list(cmd)
        retry[retry.index("--measurement-interval") + 1] = str(factor * a.interval_ms)
        done = pa_call(a, retry + ["-s", str(looser)], env)
        stability = looser
    seconds = time.time() - t0
    cpu = cpu_use(c0, cpu_sample(a), seconds)
    time.sleep(0.6)  # the backend publishes its metrics every 250 ms
    text = metrics_text(a.port)
    k1, h1 = scrape(a.port, stats_model, text)
    d1 = device_counts(a.port, stats_model, text)
    s1 = server_stats(client, stats_model)
    if done.returncode != 0 or not os.path.exists(raw):
        print(done.stdout[-3000:], done.stderr[-2000:], flush=True)
        failures.append(f"perf_analyzer gave no figure: {kind} concurrency {conc} ({mode} calls)")
        return None
    csv_row = read_row(raw)
    ips = csv_row["Inferences/Second"]
    queries = ips / pairs_per_query if batch > 1 else ips  # one perf_analyzer inference: a pair (-b 270) or a query
    pairs = queries * pairs_per_query
    delta = {k: s1[k] - s0[k] for k in s1}
    r = {"kind": kind, "model": model, "concurrency": conc, "pa_mode": mode, "retried": retried, "channel_share": share,
         "shm": None if a.pa_shm == "cuda" else a.pa_shm,
         "batch": {"mlperf": a.mlperf_sizes, "probe1": 1, "big": a.big_pairs}.get(kind, QUERY),
         "csv": csv_row, "pairs_per_s": pairs, "queries_per_s": queries, "lookups_per_s": pairs * WIDTH,
         **{f"p{q}_ms": csv_row[f"p{q} latency"] / 1e3 for q in (50, 90, 95, 99)},
         "avg_ms": sum(csv_row[k] for k in dlrm_v2_report.PARTS) / 1e3, "stability_pct": stability,
         "hit_rate": (h1 - h0) / (k1 - k0) if k1 > k0 else None, "keys_per_s": (k1 - k0) / seconds,
         "pairs_per_execution": delta["inferences"] / delta["executions"] if delta["executions"] else None,
         "server_ms_per_request": {k: delta[k] / delta["requests"] / 1e6 for k in
                                   ("queue", "compute_input", "compute_infer", "compute_output")} if delta["requests"] else {},
         "seconds": seconds, "pool": os.path.basename(data), "cpu": cpu, "per_device": per_device(d0, d1, pairs)}
    if a.verbose or a.timing:
        r["timing"] = timing_of_run(a, log_at)
    runs.append(r)
    hr = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.4f}"
    pe = "-" if r["pairs_per_execution"] is None else f"{r['pairs_per_execution']:,.0f}"
    print(f"  {kind:<17} c={conc:<3} {mode:<5}" + ("" if share is None else f" {share} a connection")
          + ("" if a.pa_shm == "cuda" else f" {a.pa_shm} shm")
          + f" {pairs / 1e6:7.2f} M pairs/s {queries:9,.0f} queries/s "
          f"{pairs * WIDTH / 1e9:6.2f} "
          f"G lookups/s  p50 {r['p50_ms']:7.2f}  p99 {r['p99_ms']:7.2f} ms  hit rate {hr}  {pe} pairs per execution"
          + ("" if stability == 10 else f"  (-s {stability})") + ("  (run again: connections lost)" if retried else "")
          + f"\n    {cpu_text(cpu)}" + device_text(r), flush=True)
    return r


def probe_clients_run(a, n, conc, data, runs, failures):
    """One-pair queries from `n` perf_analyzer processes at once (`conc` split among them, async
    calls, inputs in the requests' bodies), their queries/s summed: if n clients give about n
    times one's, the client was the limit; if the sum stays, the server is."""
    procs, raws = [], []
    each = max(1, conc // n)
    for i in range(n):
        raw = os.path.join(a.work, "raw", f"probe1_clients{n}_{i}.csv")
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        if os.path.exists(raw):
            os.remove(raw)
        cmd = [a.perf_analyzer, "-m", "dlrm_v2", "-b", "1", "--concurrency-range", f"{each}:{each}", "-i", "grpc",
               "-u", f"localhost:{a.port + 1}", "--async", "--input-data", data,
               "--measurement-interval", str(a.interval_ms), "--max-trials", "6", "-s", "25", "-f", raw]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        raws.append(raw)
    c0, t0 = cpu_sample(a), time.time()
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(30, min(a.pa_timeout_s, left_s(a))))[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(stopped: past --pa-timeout-s)")
    cpu = cpu_use(c0, cpu_sample(a), time.time() - t0)
    rows = [read_row(r) for r in raws if os.path.exists(r)]
    if len(rows) < n or any(p.returncode != 0 for p in procs):
        for o in outs:
            print(o[-1500:], flush=True)
        failures.append(f"perf_analyzer gave no figure: one-pair queries from {n} processes at concurrency {conc}")
        return None
    qps = sum(r["Inferences/Second"] for r in rows)
    r = {"kind": "probe1_clients", "model": "dlrm_v2", "clients": n, "concurrency": each * n, "pa_mode": "async",
         "queries_per_s": qps, "pairs_per_s": qps, "per_client_queries_per_s": [r["Inferences/Second"] for r in rows],
         "p99_ms": max(r["p99 latency"] for r in rows) / 1e3, "cpu": cpu}
    runs.append(r)
    print(f"  one-pair queries, {n} perf_analyzer process(es) x {each} in flight (request bodies): {qps:,.0f} queries/s "
          f"({', '.join(f'{x:,.0f}' for x in r['per_client_queries_per_s'])}); worst p99 {r['p99_ms']:.2f} ms"
          f"\n    {cpu_text(cpu)}", flush=True)
    return r


def device_text(r):
    """A line of pairs/s per GPU where a run used several."""
    per = r.get("per_device") or {}
    if len(per) < 2:
        return ""
    return "\n    per GPU: " + ", ".join(f"{d} {v / 1e6:.2f} M pairs/s" for d, v in per.items())


def cpu_sample(a):
    """(host jiffies busy, host jiffies in all, the server's jiffies, children's CPU seconds so far)."""
    import resource
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    threads = server_threads(a)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return sum(v) - idle, sum(v), sum(j for _, j in threads.values()), ch.ru_utime + ch.ru_stime, threads


def server_threads(a):
    """{thread id: (name, jiffies of user and system time)} of the server's threads; {} where there
    is no server. The server's time is taken as their sum: a thread that ends between two samples
    is not counted."""
    out = {}
    try:
        from tritonserver_process import server_pid
        base = f"/proc/{server_pid(a.port)}/task"
        for tid in os.listdir(base):
            try:
                with open(f"{base}/{tid}/stat") as f:
                    head, rest = f.read().rsplit(")", 1)
                fields = rest.split()
                out[tid] = (head.split("(", 1)[1], int(fields[11]) + int(fields[12]))
            except (OSError, ValueError, IndexError):
                continue
    except (OSError, SystemExit):
        pass
    return out


def cpu_use(s0, s1, seconds):
    """The host's CPU over a run, from two cpu_sample()s: busy %, cores used by the server and by
    the client (the benchmark's children: perf_analyzer or stream_client, counted once they exit)."""
    hz = os.sysconf("SC_CLK_TCK")
    total = max(1, s1[1] - s0[1])
    busiest = sorted(((t1 - s0[4].get(tid, (n, 0))[1], n) for tid, (n, t1) in s1[4].items()), reverse=True)[:6]
    return {"host_busy_pct": 100.0 * (s1[0] - s0[0]) / total, "cpus": os.cpu_count(),
            "server_cores": (s1[2] - s0[2]) / hz / max(seconds, 1e-9),
            "client_cores": (s1[3] - s0[3]) / max(seconds, 1e-9),
            "busiest_server_threads": [[n, j / hz / max(seconds, 1e-9)] for j, n in busiest]}


def cpu_text(c):
    threads = ", ".join(f"{n} {cores:.2f}" for n, cores in c.get("busiest_server_threads", []))
    return (f"CPU: host {c['host_busy_pct']:.0f}% busy of {c['cpus']}, tritonserver {c['server_cores']:.1f} cores, "
            f"client {c['client_cores']:.1f} cores; the server's busiest threads (cores): {threads}")


def log_size(a):
    path = os.path.join(a.work, "server.log")
    return os.path.getsize(path) if os.path.exists(path) else 0


def timing_of_run(a, start):
    """With --verbose: the medians and 99th percentiles of the backend's `timing:` lines the server
    logged since byte `start` of its log (bench/gpu/timing_summary.py), printed; {kind: {step: [median, p99, n]}}."""
    import timing_summary
    with open(os.path.join(a.work, "server.log"), "rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    found = timing_summary.figures(lines)
    out = {}
    for (kind, label), v in found.items():
        med, p99 = timing_summary.rank(v, 0.5), timing_summary.rank(v, 0.99)
        out.setdefault(kind, {})[label] = [med, p99, len(v)]
        print(f"    timing {kind}: {label} median {med} p99 {p99} (n={len(v)})", flush=True)
    return out


def perf_phase(a, client, pool, setup, res, failures, part):
    """The perf_analyzer runs of `part`: "fixed270" (a warm-up, then the 270-pair queries: the
    issue's figure, first), or "rest" (MLPerf-like sizes, 270 through the twin, the lookup)."""
    reserve = 0 if a.no_reference else 100  # seconds kept for the reference and the report
    runs = res["perf"]

    def room(what):
        if left_s(a) - reserve < 30:
            print(f"  (skipped: {what}; {left_s(a):.0f} s left of --budget-s {a.budget_s:.0f})", flush=True)
            return False
        return True

    if part == "fixed270":
        # a first run whose figure is not kept: the cache fills, the graphs of the batches the
        # dynamic batcher forms are captured, before any measured window
        if a.concs and room("the warm-up"):
            perf_run(a, client, "fixed270", "dlrm_v2", QUERY, max(a.concs), pool["fixed270"][0], QUERY, [], [])
            print("  (that run warmed the server up; not kept)", flush=True)
        for c in a.concs:
            for mode in a.pa_mode_list:
                for share in [None] if mode in HTTP_MODES else a.channel_shares or [None]:
                    if room(f"270-pair queries at concurrency {c} ({mode} calls)"):
                        perf_run(a, client, "fixed270", "dlrm_v2", QUERY, c, pool["fixed270"][0], QUERY, runs,
                                 failures, mode, share)
                        save_json(a, res)
        return
    for c in a.mlperf_concs:
        for mode in a.pa_mode_list:
            if room(f"MLPerf-like queries at concurrency {c} ({mode} calls)"):
                perf_run(a, client, "mlperf", "dlrm_v2_queries", 1, c, pool["mlperf"][0], setup["mlperf_mean_pairs"],
                         runs, failures, mode)
                save_json(a, res)
    for c in a.lookup_concs:
        if room(f"the lookup alone at concurrency {c}"):
            perf_run(a, client, "lookup", "dlrm_v2_lookup", QUERY, c, pool["lookup"][0], QUERY, runs, failures)
            save_json(a, res)
    for c in a.probe_concs:
        for mode in a.pa_mode_list:
            if room(f"one-pair queries at concurrency {c} ({mode} calls)"):
                perf_run(a, client, "probe1", "dlrm_v2", 1, c, pool["fixed270"][0], 1, runs, failures, mode)
                save_json(a, res)
    for c in a.big_concs:
        for mode in a.pa_mode_list:
            if room(f"requests of {a.big_pairs} pairs at concurrency {c} ({mode} calls)"):
                perf_run(a, client, "big", "dlrm_v2_queries", 1, c, pool["big"][0], a.big_pairs, runs, failures,
                         mode)
                save_json(a, res)
    for n in a.probe_client_counts:
        for c in a.probe_concs[-1:]:
            if room(f"one-pair queries from {n} perf_analyzer processes at concurrency {c}"):
                probe_clients_run(a, n, c, pool["fixed270"][0], runs, failures)
                save_json(a, res)
    if a.mlperf_concs and not a.quick and room("270-pair queries through the twin"):
        # the same 270-pair queries through the twin: what its ensemble hop costs (last: a comparison)
        perf_run(a, client, "fixed270_ensemble", "dlrm_v2_queries", 1, max(a.mlperf_concs),
                 pool["fixed270_ensemble"][0], QUERY, runs, failures)
        save_json(a, res)


def capi_range(concs):
    """perf_analyzer's --concurrency-range for --capi-concurrency: one value, or an even step."""
    concs = sorted(concs)
    steps = {b - a for a, b in zip(concs, concs[1:])}
    if len(steps) > 1:
        raise ValueError(f"--capi-concurrency {concs}: one value or an even step (perf_analyzer takes START:END:STEP)")
    return f"{concs[0]}:{concs[-1]}:{steps.pop() if steps else 1}"


SERVER_COUNTS = re.compile(r"Inference count: (\d+)\s+Execution count: (\d+)")


def capi_phase(a, repo, pool, res, failures):
    """270-pair queries through Triton's C API, after the server has stopped: perf_analyzer loads
    libtritonserver.so from --capi-dir/lib and this backend from --capi-dir/backends and serves
    dlrm_v2 from the same repository in its own process. Triton's scheduler, dynamic batcher and
    this backend run as in tritonserver; the gRPC front end is not in the path. The inputs lie in
    --capi-shm: GPU memory as over gRPC (perf_analyzer registers its own device buffers with the
    server in its process), or host memory, which the backend copies up. One perf_analyzer
    process for every concurrency, the lowest first (its first windows fill the caches and
    capture the graphs)."""
    one = os.path.join(a.work, "capi_repo")
    shutil.rmtree(one, ignore_errors=True)
    os.makedirs(one)
    os.symlink(os.path.join(repo, "dlrm_v2"), os.path.join(one, "dlrm_v2"))
    raw = os.path.join(a.work, "raw", "fixed270_capi.csv")
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    if os.path.exists(raw):
        os.remove(raw)
    cmd = [a.perf_analyzer, "-m", "dlrm_v2", "-b", str(QUERY), "--concurrency-range", capi_range(a.capi_concs),
           "--service-kind", "triton_c_api", "--triton-server-directory", a.capi_dir, "--model-repository", one,
           "--input-data", pool["fixed270"][0], "--shared-memory", a.capi_shm, "--output-shared-memory-size",
           str(1 << 20), "--measurement-interval", str(a.interval_ms), "--max-trials", "10", "-f", raw]
    import torch
    from tritonserver_process import capi_env
    env = capi_env(a.capi_dir, a.libtorch_dir or os.path.join(os.path.dirname(torch.__file__), "lib"))
    print("  " + " ".join(cmd), flush=True)
    c0, t0 = cpu_sample(a), time.time()
    # the reference's share of the budget kept, as perf_phase keeps it
    limit = max(60, min(a.pa_timeout_s * len(a.capi_concs) + 120, left_s(a) - (0 if a.no_reference else 100)))
    done = pa_call(a, cmd, env, limit)
    seconds = time.time() - t0
    cpu = cpu_use(c0, cpu_sample(a), seconds)
    with open(os.path.join(a.work, "raw", "fixed270_capi.log"), "w") as f:
        f.write(done.stdout + "\n--- stderr\n" + done.stderr)
    if not os.path.exists(raw):
        print(done.stdout[-3000:], done.stderr[-2000:], flush=True)
        failures.append(f"perf_analyzer (C API) gave no figure: 270-pair queries at {a.capi_concurrency}")
        return
    if done.returncode != 0:
        # its CSV is written once every concurrency is measured: the figures stand, the exit is a failure
        print(done.stderr[-2000:], flush=True)
        failures.append(f"perf_analyzer (C API) exited with {done.returncode} after writing its figures")
    rows = read_rows(raw)
    counts = SERVER_COUNTS.findall(done.stdout)
    for i, row in enumerate(rows):
        pairs = row["Inferences/Second"]  # -b 270: an inference is a pair
        inf, ex = (int(x) for x in counts[i]) if i < len(counts) else (0, 0)
        r = {"kind": "fixed270_capi", "model": "dlrm_v2", "concurrency": int(row["Concurrency"]), "pa_mode": "capi",
             "shm": a.capi_shm,
             "retried": False, "batch": QUERY, "csv": row, "pairs_per_s": pairs, "queries_per_s": pairs / QUERY,
             "lookups_per_s": pairs * WIDTH, **{f"p{q}_ms": row[f"p{q} latency"] / 1e3 for q in (50, 90, 95, 99)},
             "avg_ms": sum(row.get(k, 0.0) for k in dlrm_v2_report.PARTS) / 1e3, "stability_pct": 10,
             "hit_rate": None, "pairs_per_execution": inf / ex if ex else None, "seconds": seconds,
             "pool": os.path.basename(pool["fixed270"][0]), "cpu": cpu, "per_device": {}}
        res["perf"].append(r)
        pe = "-" if r["pairs_per_execution"] is None else f"{r['pairs_per_execution']:,.0f}"
        print(f"  fixed270 C API ({a.capi_shm:<6}) c={r['concurrency']:<3} {pairs / 1e6:7.2f} M pairs/s {r['queries_per_s']:9,.0f} "
              f"queries/s {pairs * WIDTH / 1e9:6.2f} G lookups/s  p50 {r['p50_ms']:7.2f}  p99 {r['p99_ms']:7.2f} ms  "
              f"{pe} pairs per execution", flush=True)
    print(f"    over the whole perf_analyzer process (Triton inside, {seconds:.0f} s with the load): host "
          f"{cpu['host_busy_pct']:.0f}% busy of {cpu['cpus']}, perf_analyzer {cpu['client_cores']:.1f} cores", flush=True)
    save_json(a, res)


# ------------------------------------------------------------------ the endless stream

def stream_phase(a, client, rows, plan, res, failures):
    """Queries of --stream-pairs pairs (270) from one pool in GPU memory (drawn there, the same Zipf law), sent by
    examples/stream_client.rs over HTTP to dlrm_v2: --stream-warm-passes passes warm the cache,
    then at least --stream-seconds (and one pass) per level of --stream-concurrency. With
    --stream-fresh the pool is drawn again before every pass: no query repeats, and the
    expected rate is the policy's on an endless stream (LRU's, or LFU's the stationary rate)."""
    import torch
    import stream_load
    from cuda_shm import Region
    q = a.stream_pairs
    qbytes, dbytes, obytes = q * WIDTH * 8, q * 13 * 4, q * 4
    if a.cache < 1.0:
        want = max(1, math.ceil(plan["need_pairs"] / q))
    else:
        want = 2048  # every row in HBM: no hit rate to reach, a pool of distinct queries is enough
    free = torch.cuda.mem_get_info()[0]
    cap = int(min(a.stream_gb * 1e9, free - (6 << 30)) // qbytes)
    n = max(16, min(want, cap))
    if a.cache >= 1.0:
        expected = 1.0
    elif a.stream_fresh:
        expected = plan["stationary"] if a.cache_policy == "lfu" else plan["lru"]
    else:
        expected = expected_pool_rate(plan, n * q)
    print(f"  pool: {n:,} queries of {q} pairs ({n * qbytes / 1e9:.1f} GB of keys in GPU memory; the LRU rate needs "
          f"{want:,}); expected measured hit rate {expected:.4f}, the endless stream's LRU rate {plan['lru']:.4f}, "
          f"stationary {plan['stationary']:.4f}", flush=True)
    made = []
    try:
        keys = Region(client, "dlrm_v2_stream_keys", n * qbytes)
        made.append(keys)
        dense = Region(client, "dlrm_v2_stream_dense", 16 * dbytes)
        made.append(dense)
        for i in range(max(a.stream_levels)):
            made.append(Region(client, f"dlrm_v2_stream_out_{i}", obytes))
        gen = torch.Generator(device="cuda").manual_seed(SEED + 46)

        def draw():
            step = max(1, 512 * QUERY // q)  # about 1 GB of keys drawn at a time
            for first in range(0, n, step):
                m = min(step, n - first)
                k = torch.empty((m, q, WIDTH), dtype=torch.int64, device="cuda")
                for t, (r, h) in enumerate(zip(rows, HOT)):
                    ranks = stream_load.torch_zipf_ranks(gen, r, a.alpha, m * q * h, "cuda")
                    k[:, :, START[t]:START[t] + h] = stream_load.torch_spread(ranks, r).view(m, q, h)
                keys.write_tensor(k, first * qbytes)
                del k
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

        t0 = time.time()
        draw()
        dense.write(np.random.default_rng(5).random((16, q, 13), dtype=np.float32))
        print(f"  pool drawn in {time.time() - t0:.0f} s" + ("; drawn again before every pass (--stream-fresh)"
                                                            if a.stream_fresh else ""), flush=True)
        at = 0

        def send(count, conc):
            nonlocal at
            cmd = [a.stream_client, "--url", f"localhost:{a.port}", "--model", "dlrm_v2", "--start", str(at),
                   "--count", str(count), "--concurrency", str(conc),
                   "--input", f"sparse,INT64,{q}x{WIDTH},{keys.name},{qbytes},{n}",
                   "--input", f"dense,FP32,{q}x13,{dense.name},{dbytes},16",
                   "--output", f"prediction,dlrm_v2_stream_out_,{obytes}"]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(60, int(left_s(a))))
            if p.returncode != 0:
                raise RuntimeError(f"stream_client failed: {p.stderr.strip()[-2000:]}")
            at += count
            out = json.loads(p.stdout)
            return out["seconds"], sorted(out["latencies_ms"])

        def passes(count, conc):
            """`count` queries; with --stream-fresh a pass of the pool at a time, each of new keys
            (the draw between passes is not timed): (seconds, sorted latencies)."""
            if not a.stream_fresh:
                return send(count, conc)
            seconds, lat, left = 0.0, [], count
            while left > 0:
                draw()
                s_, l_ = send(min(n, left), conc)
                seconds, lat, left = seconds + s_, lat + l_, left - min(n, left)
            return seconds, sorted(lat)

        for w in range(max(1, a.stream_warm_passes)):
            if w > 0 and a.stream_fresh:
                draw()
            warm_s, _ = send(n, max(a.stream_levels))
            rate = n * q / warm_s
            print(f"  warm pass {w + 1}: {n:,} queries in {warm_s:.1f} s ({rate / 1e6:.2f} M pairs/s, the cache filling)",
                  flush=True)
        for c in a.stream_levels:
            if left_s(a) < stream_room_s(a):
                print(f"  (skipped: the stream at concurrency {c}; {left_s(a):.0f} s left)", flush=True)
                continue
            count = max(n, math.ceil(rate * a.stream_seconds / q))
            if a.stream_fresh:
                count = math.ceil(count / n) * n  # whole passes, each of new keys
            time.sleep(0.6)  # the metrics published after the warm passes' last lookups
            text = metrics_text(a.port)
            k0, h0 = scrape(a.port, "dlrm_v2", text)
            d0 = device_counts(a.port, "dlrm_v2", text)
            c0, log_at = cpu_sample(a), log_size(a)
            busy = GpuBusy(int((a.gpus or "0").split(",")[0]))
            seconds, lat = passes(count, c)
            gpu_busy = busy.stop()
            cpu = cpu_use(c0, cpu_sample(a), seconds)
            time.sleep(0.6)
            text = metrics_text(a.port)
            k1, h1 = scrape(a.port, "dlrm_v2", text)
            d1 = device_counts(a.port, "dlrm_v2", text)
            rate = count * q / seconds
            r = {"kind": "stream", "model": "dlrm_v2", "batch": q, "concurrency": c, "pairs_per_s": rate,
                 "queries_per_s": count / seconds, "lookups_per_s": rate * WIDTH,
                 **{f"p{pc}_ms": stream_load.percentile(lat, pc) for pc in (50, 90, 95, 99)},
                 "hit_rate": (h1 - h0) / (k1 - k0) if k1 > k0 else None, "expected_hit_rate": expected,
                 "pool_queries": n, "pool_gb": n * qbytes / 1e9, "queries": count, "seconds": seconds, "cpu": cpu,
                 "gpu_busy_pct": gpu_busy,
                 "per_device": per_device(d0, d1, rate)}
            if a.verbose or a.timing:
                r["timing"] = timing_of_run(a, log_at)
            res["stream"].append(r)
            hr = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.4f}"
            print(f"  stream            c={c:<3} {rate / 1e6:7.2f} M pairs/s {r['queries_per_s']:9,.0f} queries/s "
                  f"{r['lookups_per_s'] / 1e9:6.2f} G lookups/s  p50 {r['p50_ms']:7.2f}  p99 {r['p99_ms']:7.2f} ms  "
                  f"hit rate {hr} (expected {expected:.4f})\n    {cpu_text(cpu)}"
                  + ("" if gpu_busy is None else f"; GPU busy {gpu_busy:.0f}% (nvidia-smi)") + device_text(r), flush=True)
            save_json(a, res)
    except Exception as e:  # noqa: BLE001 - the stream is one figure among several: said, counted, the run goes on
        print(f"  the endless stream failed: {e}", flush=True)
        failures.append(f"the endless stream: {str(e)[:300]}")
    finally:
        for region in reversed(made):
            try:
                region.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                pass
        torch.cuda.empty_cache()


# ------------------------------------------------------------------ the bare PyTorch reference

def reference_network():
    """DCNv2's dense part in fp16 (the weights the package holds), cross layers as written:
    plain PyTorch. Its matrix products' FLOPs per pair: 2 x in x out per linear layer."""
    from recsys.networks import dense_network, linear_flops
    net = dense_network("dcnv2", "fp16", "cuda").m  # HalfDense's fp16 module: fp16 in, fp16 out
    return (net, *linear_flops(net))


def compile_network(mode, batches, label):
    """torch.compile of the reference's network at each batch (static shapes): the compiled network."""
    import torch
    net = reference_network()[0]
    fn = torch.compile(net, mode=mode, dynamic=False)
    t0 = time.time()
    for b in batches:
        with torch.no_grad():
            fn(torch.rand(b, 13, device="cuda", dtype=torch.half),
               torch.randn(b, TABLES, DIM, device="cuda", dtype=torch.half) * 0.05)
        torch.cuda.synchronize()
        print(f"  {label}: the reference network compiled at batch {b} ({mode}), {time.time() - t0:.0f} s so far", flush=True)
    return fn


def start_compile_warmer(a):
    """The reference's compile in a child process, beside the fixture write and the export: it
    fills Inductor's on-disk caches (FX graphs, autotuning), so the compile after the server
    stops finds them. A child, because a compile cannot be stopped inside a process: one past
    --ref-compile-budget-s is killed and the reference compiled in the default mode."""
    cmd = [sys.executable, os.path.abspath(__file__), "--compile-worker", a.ref_compile_mode, a.ref_batches]
    return subprocess.Popen(cmd), time.time()


def finish_compile_warmer(a, warmer):
    """Waits for the child up to --ref-compile-budget-s from its start; (mode, note)."""
    proc, t0 = warmer
    try:
        rc = proc.wait(timeout=max(1.0, a.ref_compile_budget_s - (time.time() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        note = (f"torch.compile(mode=\"{a.ref_compile_mode}\") took more than --ref-compile-budget-s "
                f"{a.ref_compile_budget_s:.0f} s: the reference's network is compiled in the default mode instead.")
        print(f"  NOTE: {note}", flush=True)
        return "default", note
    if rc != 0:
        note = f"the compile in mode \"{a.ref_compile_mode}\" failed (exit {rc}): the default mode instead."
        print(f"  NOTE: {note}", flush=True)
        return "default", note
    print(f"  the reference's compile ({a.ref_compile_mode}) warmed Inductor's caches in {time.time() - t0:.0f} s", flush=True)
    return a.ref_compile_mode, ""


def cuda_seconds(fn, iters):
    """Seconds per call of fn(i), by CUDA events, after three calls to warm up."""
    import torch
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        fn(i)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def reference_phase(a, rows, mode, note, warm_s):
    """The bare PyTorch reference (issue 46): every table in HBM, F.embedding_bag per table
    (sum, full bags), the compiled network; the lookup alone, the network alone, both."""
    import torch
    import torch.nn.functional as F
    import stream_load
    dev = "cuda"
    _, flops, layers = reference_network()
    print(f"  the network: {flops / 1e6:.2f} MFLOP of matrix products per pair (2 x in x out over {layers} linear layers)",
          flush=True)
    t0 = time.time()
    compiled = compile_network(mode, a.ref_batch_list, "after the server")
    compile_s = time.time() - t0
    t0 = time.time()
    # values do not matter for timing; the shapes are the served tables'
    tables = [torch.empty((r, DIM), dtype=torch.half, device=dev).normal_(0.0, 0.05) for r in rows]
    torch.cuda.synchronize()
    print(f"  {len(tables)} fp16 tables in HBM ({sum(rows) * ROW_BYTES / 1e9:.1f} GB) in {time.time() - t0:.0f} s", flush=True)
    gen = torch.Generator(device=dev).manual_seed(SEED + 7)
    out = {}
    with torch.no_grad():
        for b in a.ref_batch_list:
            offsets = [torch.arange(b, device=dev, dtype=torch.int64) * h for h in HOT]
            # four distinct key sets per batch, each table's bags flat (the same Zipf law as served)
            keysets = [[stream_load.torch_spread(stream_load.torch_zipf_ranks(gen, r, a.alpha, b * h, dev), r)
                        for r, h in zip(rows, HOT)] for _ in range(4)]
            dense = torch.rand(b, 13, device=dev, dtype=torch.half)

            def lookup(i):
                ks = keysets[i % len(keysets)]
                return torch.stack([F.embedding_bag(k, w, o, mode="sum") for k, w, o in zip(ks, tables, offsets)], dim=1)

            pooled = lookup(0)
            t_lookup = cuda_seconds(lookup, 30)
            t_net = cuda_seconds(lambda i: compiled(dense, pooled), 30)
            t_both = cuda_seconds(lambda i: compiled(dense, lookup(i)), 30)
            x = {"lookup_s": t_lookup, "lookups_per_s": b * WIDTH / t_lookup,
                 "row_gb_per_s": b * WIDTH * ROW_BYTES / t_lookup / 1e9, "net_s": t_net, "tflops": b * flops / t_net / 1e12,
                 "both_s": t_both, "pairs_per_s": b / t_both}
            out[str(b)] = x
            print(f"  reference batch {b:,} pairs: lookup {t_lookup * 1e3:.3f} ms ({x['lookups_per_s'] / 1e9:.2f} G lookups/s, "
                  f"{x['row_gb_per_s']:.0f} GB/s of rows); network {t_net * 1e3:.3f} ms ({x['tflops']:.0f} TFLOP/s, "
                  f"{100 * x['tflops'] / a.peak_tflops:.0f}% of {a.peak_tflops:.0f}); both {t_both * 1e3:.3f} ms "
                  f"({x['pairs_per_s'] / 1e6:.2f} M pairs/s)", flush=True)
            del keysets, pooled
    del tables
    torch.cuda.empty_cache()
    return {"batches": out, "mode": mode, "compile_seconds": compile_s, "warm_compile_seconds": warm_s, "note": note,
            "flops_per_pair": flops, "linear_layers": layers, "peak_tflops": a.peak_tflops}


# ------------------------------------------------------------------ results

def save_json(a, res, setup=None):
    """runs.json (after every run: a call cut off by its timeout keeps what it measured), and setup.json."""
    with open(os.path.join(a.results, "runs.json"), "w") as f:
        json.dump(res, f, indent=1)
    if setup is not None:
        with open(os.path.join(a.results, "setup.json"), "w") as f:
            json.dump(setup, f, indent=1)


def clear_results(folder):
    """The benchmark's own files from an earlier run (run.sh's console.log and host.txt stay)."""
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name in ("README.md", "setup.json", "runs.json", "perf.tgz") or name.endswith(".png"):
            os.remove(os.path.join(folder, name))


def pack(a, log_path):
    """perf.tgz: the raw perf_analyzer CSVs, the pools' descriptions, the configs and the server
    log's end (a device call returns at most 8 files)."""
    with tarfile.open(os.path.join(a.results, "perf.tgz"), "w:gz") as tar:
        raw = os.path.join(a.work, "raw")
        if os.path.isdir(raw):
            tar.add(raw, arcname="perf/raw")
        for name in ("pools.txt", "gpu_dmon.log"):  # gpu_dmon.log: run.sh's nvidia-smi dmon, where it ran
            if os.path.exists(os.path.join(a.work, name)):
                tar.add(os.path.join(a.work, name), arcname=f"perf/{name}")
        for m in ("dlrm_v2", "dlrm_v2_lookup", "dlrm_v2_queries"):
            cfg = os.path.join(a.work, "repo", m, "config.pbtxt")
            if os.path.exists(cfg):
                tar.add(cfg, arcname=f"perf/configs/{m}.pbtxt")
        if os.path.exists(log_path):
            tail = os.path.join(a.work, "server_tail.log")
            with open(log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(log_path) - 2_000_000))
                data = f.read()
            with open(tail, "wb") as f:
                f.write(data)
            tar.add(tail, arcname="perf/server_tail.log")


def gpu_facts():
    """(the GPU's name and memory, its driver) from nvidia-smi."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True)
        line = p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else ""
    except OSError:
        line = ""
    line = line or "unknown GPU, unknown, -"
    name, driver, memory = [x.strip() for x in (line.split(",") + ["-", "-"])[:3]]
    return f"{name}, {memory}", driver


def main():
    a = parse()
    clear_results(a.results)
    os.makedirs(a.work, exist_ok=True)
    shutil.rmtree(os.path.join(a.work, "raw"), ignore_errors=True)
    import torch
    gpu, driver = gpu_facts()
    rows = fixture_rows(a.scale)
    params = sum(rows) * DIM
    graphs = graph_batches(a.graph_batches, a.max_batch)
    plan = cache_plan(rows, a.cache, a.allocation, a.alpha, a.hit_rate_bound)
    setup = {"command": a.command, "argv": sys.argv, "gpu": gpu, "driver": driver, "torch": torch.__version__,
             "pa_modes": a.pa_mode_list, "pa_threads": a.pa_threads,
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "scale": a.scale, "rows": sum(rows),
             "rows_per_table": rows, "parameters": params, "table_gb": sum(rows) * ROW_BYTES / 1e9, "cache": a.cache,
             "allocation": a.allocation, "cached_rows": sum(plan["cached_per_table"]), "cache_plan": plan,
             "cache_policy": a.cache_policy, "miss_reads": a.miss_reads, "host_memory": a.host_memory, "stream_fresh": a.stream_fresh, "stream_warm_passes": a.stream_warm_passes,
             "instances": a.instances, "gpus": a.gpus, "server_args": a.server_arg, "placement": a.placement, "replicate_share": a.replicate_share, "sharded_memory_gb": a.sharded_memory_gb, "cache_rows": a.cache_rows, "max_queue_delay_us": a.max_queue_delay_us, "max_batch": a.max_batch,
             "graph_batches": ("the backend's powers of two" if graphs is None else
                               ",".join(map(str, graphs)) if graphs else "none (off)"),
             "dcnv2_cross": a.dcnv2_cross, "network_precision": a.network_precision, "alpha": a.alpha, "interval_ms": a.interval_ms, "quick": a.quick,
             "stream_note": "not run"}
    print(f"GPU: {gpu}, driver {driver}; torch {torch.__version__}", flush=True)
    print(f"DLRM-v2 at scale {a.scale}: {sum(rows):,} rows ({params / 1e9:.1f} B parameters, "
          f"{setup['table_gb']:.1f} GB fp16), {WIDTH} lookups per pair; GPU cache {a.cache} ({a.allocation}, {a.cache_policy}, misses read by the {a.miss_reads}, "
          f"{setup['cached_rows']:,} slots); alpha {a.alpha}: hit rate stationary {plan['stationary']:.4f}, "
          f"LRU on an endless stream {plan['lru']:.4f} (hotness-weighted)", flush=True)
    failures = []
    res = {"perf": [], "stream": [], "reference": None, "exactness": None}

    # 1. the tables, on a thread of their own: the export and the compile need none
    phase("tables (criteo_fixture), the export and the reference's compile beside it")
    fa = SimpleNamespace(fixture=a.fixture, scale=a.scale, dim=DIM, work=a.work, fixture_bin=a.fixture_bin,
                         cache_share=a.cache, host_memory=a.host_memory)
    fixture = {}

    def write_tables():
        try:
            fixture["folder"], fixture["t0"] = prepare(fa, rows)
            fixture["seconds"] = time.time() - fixture["t0"]
        except BaseException as e:  # noqa: BLE001 - raised again on the main thread
            fixture["error"] = e

    writer = threading.Thread(target=write_tables, name="fixture")
    writer.start()
    warmer = None if a.no_reference else start_compile_warmer(a)

    # 2. the network: the package, and the reference's compile
    from recsys.networks import export_aoti
    ea = SimpleNamespace(precision=a.network_precision, aoti_dlrm_interaction="triton", dcnv2_cross=a.dcnv2_cross,
                         example_batch=0, work=a.work, inductor=a.inductor, cross_config="", dim=DIM,
                         calibration=calibration(a))
    t0 = time.time()
    package = export_aoti("dcnv2", ea, "TYPE_FP16", a.max_batch)
    setup["export_seconds"] = time.time() - t0
    pool = pools(a, rows, setup)
    print("  pools: " + "; ".join(setup["pools"].values()), flush=True)
    if warmer is not None:
        mode, note = finish_compile_warmer(a, warmer)
        warm_s = time.time() - warmer[1]
    writer.join()
    if "error" in fixture:
        raise fixture["error"]
    setup["fixture"], setup["fixture_seconds"] = fixture["folder"], fixture["seconds"]
    a.host_memory = setup["host_memory"] = fa.host_memory  # huge_pages falls back where it would not fit
    print(f"  tables in {fixture['folder']} ({fixture['seconds']:.0f} s, written or found)", flush=True)

    # 3. the repository
    repo = os.path.join(a.work, "repo")
    write_repository(a, repo, fixture["folder"], package, graphs)
    save_json(a, res, setup)

    # 4.-5. the server: exactness, then the timed runs
    from tritonserver_process import serve
    log_path = os.path.join(a.work, "server.log")
    extra = [f"--cuda-memory-pool-byte-size={g}:{a.cuda_pool_gb << 30}" for g in (a.gpus or "0").split(",")]
    extra += a.server_arg
    if a.libtorch_dir:
        extra.append(f"--backend-config=rust,libtorch-dir={a.libtorch_dir}")
    if a.verbose:
        extra.append("--log-verbose=1")
    if a.timing:
        os.environ["TRITON_RUST_TIMING"] = "1"  # the server inherits it
    phase("tritonserver: loading dlrm_v2, dlrm_v2_lookup, dlrm_v2_queries")
    try:
        with serve(a.server, repo, a.backends, a.port, log_path, extra=extra, timeout=max(120, left_s(a) - 60)) as client:
            with open(log_path, errors="replace") as f:
                for ln in f:
                    if "sharded rows:" in ln:  # where the plan put the tables (gpucache_placement sharded)
                        print("  server: " + ln.strip()[-220:], flush=True)
            phase("exactness")
            try:
                res["exactness"] = exactness(a, rows, failures)
            except Exception as e:  # noqa: BLE001 - a model that cannot answer is a failure; the runs are tried still
                print(f"  FAIL exactness: {e}", flush=True)
                failures.append(f"exactness: {str(e)[:300]}")
                res["exactness"] = {}
            res["exactness"]["failures"] = list(failures)
            save_json(a, res)
            phase("perf_analyzer: 270-pair queries")
            perf_phase(a, client, pool, setup, res, failures, "fixed270")
            if a.stream_levels and os.path.exists(a.stream_client) and left_s(a) > stream_room_s(a) + 40:
                phase("the endless stream")
                setup["stream_note"] = (f"queries of {a.stream_pairs} pairs sent by examples/stream_client.rs (HTTP, keys in one CUDA "
                                        "shared-memory pool drawn on the GPU), dlrm_v2 batching them; "
                                        f"{a.stream_warm_passes} warm pass(es) of the pool before the measured ones"
                                        + ("; the pool drawn again (new keys) before every pass, so no query repeats"
                                           if a.stream_fresh else "; the measured passes repeat the warm pass's queries"))
                stream_phase(a, client, rows, plan, res, failures)
            elif a.stream_levels:
                why = "no stream_client" if not os.path.exists(a.stream_client) else "too little time left"
                print(f"  (the endless stream skipped: {why})", flush=True)
                setup["stream_note"] = f"not run ({why})"
            phase("perf_analyzer: MLPerf-like query sizes, the lookup alone")
            perf_phase(a, client, pool, setup, res, failures, "rest")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - what was measured is still written below
        print(f"  the served phase ended early: {e}", flush=True)
        failures.append(f"the served phase: {str(e)[:300]}")
    # the server has stopped: HBM is the C API runs', then the reference's
    if a.capi_concs and os.path.isdir(os.path.join(a.work, "repo", "dlrm_v2")):
        phase("perf_analyzer through Triton's C API (no gRPC front end)")
        if left_s(a) - (0 if a.no_reference else 100) > 60:
            capi_phase(a, repo, pool, res, failures)
        else:
            print(f"  (skipped: {left_s(a):.0f} s left of --budget-s {a.budget_s:.0f})", flush=True)

    # 6. the bare PyTorch reference
    if warmer is not None:
        phase("the bare PyTorch reference (the server stopped)")
        try:
            res["reference"] = reference_phase(a, rows, mode, note, warm_s)
        except Exception as e:  # noqa: BLE001 - the served figures are kept; the failure is said and counted
            print(f"  the reference failed: {e}", flush=True)
            failures.append(f"the bare PyTorch reference: {str(e)[:300]}")

    # 7. ratios, targets, the results folder
    phase("results")
    PHASES.pop("_open", None)
    setup["phases"] = {k: v for k, v in PHASES.items()}
    save_json(a, res, setup)
    for line in dlrm_v2_report.ratios(res):
        print(line, flush=True)
    for t, v, d in dlrm_v2_report.targets(setup, res):
        print(f"{v:4s} {t}: {d}", flush=True)
    try:
        print(f"wrote {dlrm_v2_report.write(a.results, setup, res)}", flush=True)
    except Exception as e:  # noqa: BLE001 - setup.json and runs.json are written: the report can be made again
        print(f"the report failed ({e}); python3 bench/gpu/dlrm_v2_report.py --results {a.results}", flush=True)
        failures.append(f"report: {e}")
    pack(a, log_path)
    for f in failures:
        print(f"FAIL {f}", flush=True)
    print(f"dlrm_v2_perf: {'every check passed' if not failures else f'{len(failures)} failures'}; "
          f"{time.time() - T0:.0f} s; results in {a.results}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compile-worker"]:  # start_compile_warmer's child: MODE BATCHES
        compile_network(sys.argv[2], [int(b) for b in sys.argv[3].split(",")], "compile child")
        sys.exit(0)
    sys.exit(main())
