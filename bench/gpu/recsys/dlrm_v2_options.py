"""bench/gpu/dlrm_v2_perf.py's arguments, with what follows from them: the defaults --quick
changes, the comma lists as numbers, the checks that refuse what cannot run, the results folder."""
import argparse
import os
import sys

from .dlrm_v2_model import QUERY
from .perf_analyzer import PA_MODES, capi_range

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", ".."))

QUICK = {"concurrency": "8,32", "mlperf_concurrency": "32", "lookup_concurrency": "32", "interval_ms": 2000,
         "stream_seconds": 3.0, "ref_batches": "17280", "ref_compile_mode": "default"}
DEFAULTS = {"concurrency": "4,8,16,32,64", "mlperf_concurrency": "16,64", "lookup_concurrency": "16,64",
            "interval_ms": 3000, "stream_seconds": 5.0, "ref_batches": "4320,17280",
            "ref_compile_mode": "max-autotune-no-cudagraphs"}


# perf_analyzer's --shared-memory kinds the runs use: GPU memory, or host memory
SHM_KINDS = ["cuda", "system"]


def parse(description, argv=None):
    """The parsed arguments, with what follows from them (the defaults --quick changes, the
    comma lists as numbers, the results folder); `description`: the command's help text
    (dlrm_v2_perf.py's docstring). Refuses (exit 2) what cannot run."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--cache-policy", default="lru", choices=["lru", "lfu", "pinned"],
                   help="gpucache_policy: which key a full cache set gives up (lfu: the least frequent, and a missed "
                        "key goes in only once it is looked up more often; pinned: none, the caches hold the keys of "
                        "--cache-pinned-keys from load to unload)")
    p.add_argument("--cache-pinned-keys", default="",
                   help="gpucache_pinned_keys: the cache state file whose keys pinned caches hold (one a server "
                        "with --cache-state-dir saved)")
    p.add_argument("--cache-key-index", default="off", choices=["auto", "on", "off"],
                   help="gpucache_key_index: whether the GPU caches keep a key index (4 bytes a row) that the "
                        "pooled lookup probes through instead of reading each key's set of 32 tags")
    p.add_argument("--cache-hit-stamp-every", type=int, default=1,
                   help="gpucache_hit_stamp_every: the pooled lookups stamp one hit in this many (1: every hit; a "
                        "power of two; 0: none)")
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
