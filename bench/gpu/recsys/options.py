"""recsys_perf.py's arguments, with what follows from them (the cache's row type, the
protocols, the stream's concurrency levels, the host's settings applied)."""
import argparse
import os

from host_qos import add_host_args, apply_host_args

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "..")


def parse(description, argv=None):
    """The parsed arguments; `description`: the command's help text (recsys_perf.py's docstring)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--perf-analyzer", required=True)
    p.add_argument("--fixture-bin", default=os.path.join(ROOT, ".carry", "criteo_fixture"))
    p.add_argument("--fixture", default="", help="where the tables are (default: /dev/shm/criteo if it has room, else --work)")
    p.add_argument("--work", default="/tmp/recsys")
    p.add_argument("--scale", type=float, default=0.8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--cache-share", type=float, default=0.1)
    p.add_argument("--allocation", default="store", choices=["store", "per_table"],
                   help="gpucache_allocation: the share of the store's rows (small tables whole) or of each table's")
    p.add_argument("--models", default="dlrm,dcnv2")
    p.add_argument("--batches", default="256,1024,4096,16384,65536")
    p.add_argument("--conc-batch", type=int, default=4096)
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--alphas", default="1.2,1.05")
    p.add_argument("--other-alpha-batches", default="4096,65536", help="batches measured at the alphas after the first")
    p.add_argument("--requests", default="auto",
                   help="distinct requests per (batch, alpha) pool, which perf_analyzer cycles: a number (then fewer at "
                        "batches above 4096: half to 16384, a quarter above), or auto: as many as the measured cache hit "
                        "rate needs to be the endless stream's within --hit-rate-bound (see pool_plan), at most --pool-gb")
    p.add_argument("--pool-gb", type=float, default=0.5,
                   help="auto pools: at most this many GB of keys and dense features per pool (perf_analyzer holds the "
                        "pool as JSON and, with --shared-memory cuda, in GPU memory)")
    p.add_argument("--protocol", default="grpc",
                   help="perf_analyzer's protocols to the server, each run once per protocol (its -i: grpc, http, or "
                        "grpc-streaming: gRPC with --streaming, the requests of each client on one bidirectional "
                        "stream), e.g. grpc,http")
    p.add_argument("--stream-concurrency", default="0",
                   help="also serve each measured batch of the one model an endless stream (stream_load.py: a pool as large "
                        "as the stream's hit rate needs, in GPU memory, our HTTP client) at each of these numbers of "
                        "requests in flight (e.g. 4,8: one pool, warmed once); 0: not")
    p.add_argument("--stream-client", default=os.path.join(ROOT, ".carry", "stream_client"),
                   help="the endless stream's sender (examples/stream_client.rs, built by bench/gpu/pack.sh); where it "
                        "is absent, Python threads send")
    p.add_argument("--stream-gb", type=float, default=30.0, help="the endless stream's key pool: at most this many GB")
    p.add_argument("--stream-min-requests", type=int, default=0,
                   help="the endless stream's pool holds at least this many distinct requests (a model with every row "
                        "in HBM needs none for its hit rate; this gives it the same keys' spread as its cached twin)")
    p.add_argument("--stream-passes", type=int, default=1, help="the endless stream: passes of its pool measured")
    p.add_argument("--hit-rate-threshold", default="",
                   help="the store's hit_rate_threshold (default: its own, 0.9): a lookup whose hit rate is below it "
                        "inserts its misses before it returns, above it a background thread does and drops what it "
                        "cannot keep up with; 1.0 makes every fill immediate, the LRU cache that Che's approximation "
                        "models whatever the host's load")
    p.add_argument("--prediction-bound", type=float, default=2e-3,
                   help="the single model's predictions may differ from the ensemble's by at most this "
                        "(an FP16 network against the TorchScript one: up to 3.3e-4 measured on an H100; "
                        "a request answered from another request's rows differs by 0.1 or more)")
    p.add_argument("--hit-rate-bound", type=float, default=0.002,
                   help="how far the measured hit rate may be from the endless stream's (LRU) rate")
    p.add_argument("--dense", default="torchscript", choices=["torchscript", "aoti"],
                   help="the single model's network: the TorchScript file (dense.pt), or a CUDA AOTInductor package of "
                        "the same network exported here (dense.pt2, examples/aoti_export.py); the ensemble's network "
                        "stays TorchScript, so the exactness check compares the two")
    p.add_argument("--aoti-bare", default="", help="with --dense aoti: the aoti_bare binary, for the package's bare figures")
    p.add_argument("--inductor", action="append", default=[], metavar="[MODEL:]KEY=VALUE",
                   help="with --dense aoti: an Inductor setting for the export (e.g. max_autotune=true, or "
                        "dcnv2:max_autotune=true for that model alone); repeatable")
    p.add_argument("--example-batch", type=int, default=0,
                   help="with --dense aoti: the batch the package is exported with, Inductor's size hint for the batch "
                        "dimension (default: the largest batch measured; earlier runs used 4)")
    p.add_argument("--paths", default="ens,one")
    p.add_argument("--wide-deep-batches", default="131072",
                   help="wide_deep's batch sweep at concurrency 1 (its seed: 1 and 16384 to 131072 in steps of 16384)")
    p.add_argument("--wide-deep-conc-batch", type=int, default=0,
                   help="wide_deep's requests of this many rows at each --concurrency (its seed's online scenario "
                        "sends 2048-row requests at concurrency 8 and up); 0: none")
    p.add_argument("--no-final-exactness", action="store_true",
                   help="skip the exactness checks after the runs (those before them still run)")
    p.add_argument("--kind", default="KIND_GPU")
    p.add_argument("--gpus", default="",
                   help="the GPUs of every KIND_GPU instance group, e.g. 0 or 0,1 (--one-instances on each; a cache "
                        "per GPU); default: every GPU the server sees. The endless stream's keys stay in GPU 0's "
                        "memory, so instances on other GPUs take them from there")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--rows-type", default="", choices=["", "fp32", "fp16"],
                   help="the embeddings between lookup and network (default: fp16 with an fp16 network, else fp32)")
    p.add_argument("--no-ceiling", action="store_true")
    p.add_argument("--graphs", action="store_true", help="CUDA graphs for the dense network (ensemble step and single model)")
    p.add_argument("--one-instances", type=int, default=1,
                   help="instances of the single model (sharing one GPU cache of --cache-share, or each its own: "
                        "--cache-sharing)")
    p.add_argument("--cache-sharing", default="device", choices=["device", "instance"],
                   help="gpucache_sharing: one cache per GPU shared by the instances (HPS's way), or one per instance")
    p.add_argument("--cache-rows", default="", choices=["", "fp32", "fp16"],
                   help="gpucache_row_type: how the GPU caches keep their rows (default: fp16 when the embeddings "
                        "reach the network as fp16, whose answers are then the same bits; else fp32)")
    p.add_argument("--dlrm-interaction", default="split", choices=["cat", "split"],
                   help="DLRM's dot interaction in the TorchScript network: the 27 vectors stacked, or computed without "
                        "the stack (same numbers; split's network is ~0.9 ms faster at 65536 served, launch-bound eager "
                        "at small batches: graph those)")
    p.add_argument("--aoti-dlrm-interaction", default="triton", choices=["cat", "split", "triton"],
                   help="with --dense aoti: DLRM's interaction in the package; triton: one Triton kernel compiled into "
                        "it (examples/triton_kernels.py; the network 1.27 ms instead of 1.99 at 65536 on an H100)")
    p.add_argument("--dcnv2-cross", default="torch", choices=["torch", "triton"],
                   help="with --dense aoti: DCNv2's cross layers in the package as written, or each one Triton kernel "
                        "(examples/triton_kernels.py)")
    p.add_argument("--cross-config", default="",
                   help="with --dcnv2-cross triton: the kernel's tile, warps and stages (triton_kernels.cross_config, "
                        "e.g. 128x64x64w8s3)")
    p.add_argument("--shared-memory", default="system", choices=["system", "cuda"],
                   help="perf_analyzer's inputs in system shared memory (HPS's published runs), or in CUDA shared "
                        "memory: the keys and dense features already on the GPU, as the ceiling has them")
    p.add_argument("--key-upload", default="", help="PIECE,TASKS: the lookups' gpu_key_piece and gpu_key_upload_tasks "
                   "(default: the backend's own, 131072 keys on up to 8 tasks)")
    p.add_argument("--pipeline-parts", type=int, default=1,
                   help="the single model's recommender_pipeline_parts: large batches in parts, each part's lookup "
                        "beside the network on the part before (with --graphs, list the parts' rows in --graph-rows)")
    p.add_argument("--torch-param", action="append", default=[], metavar="KEY=VALUE",
                   help="a torch engine parameter for the network (the _dense and _one models), e.g. "
                        "TORCH_FUSION_STRATEGY=STATIC:20 (repeatable)")
    p.add_argument("--graph-rows", default="", help="with --graphs: graph only requests of these rows (e.g. 256,1024,4096)")
    p.add_argument("--host-memory", default="mapped", choices=["mapped", "huge_pages"],
                   help="the store's host_memory: rows read from the fixture's mapping, or copied into huge pages at load")
    p.add_argument("--interval-ms", type=int, default=3000)
    p.add_argument("--port", type=int, default=18900)
    p.add_argument("--libtorch-dir", default="")
    p.add_argument("--verbose", action="store_true", help="server --log-verbose=1: per-batch timing lines in server.log")
    p.add_argument("--cuda-pool-gb", type=int, default=4, help="tritonserver --cuda-memory-pool-byte-size for GPU 0")
    add_host_args(p)
    a = p.parse_args(argv)
    # fp16 cache rows where the embeddings reach the network as fp16 (the same bits either way)
    a.cache_rows = a.cache_rows or (a.rows_type or ("fp16" if a.precision == "fp16" else "fp32"))
    apply_host_args(a)
    a.protocols = a.protocol.split(",")
    for proto in a.protocols:
        if proto not in ("grpc", "http", "grpc-streaming"):
            p.error(f"--protocol: {proto!r} is not grpc, http or grpc-streaming")
    a.stream_levels = [int(c) for c in a.stream_concurrency.split(",") if int(c) > 0]
    return a
