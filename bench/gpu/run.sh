#!/usr/bin/env bash
# The one runner on the GPU machine. Build and pack here first (bash bench/gpu/pack.sh), then
# one device call per subcommand, from the repository root:
#
#   bash bench/gpu/run.sh [options] SUBCOMMAND [arguments for its program]
#
#   models        all six models (FP32 and FP16, TorchScript on KIND_GPU, recommenders as
#                 ensembles whose sparse step is the embedding store) equal to torch eager on the
#                 same GPU, the ensembles checked under concurrency (all_models.py), then the GPU
#                 cache against the CPU cache and its hit path (gpu_cache_check), then the store's
#                 rows exact on a GPU instance (embedding_store.py). Arguments go to all_models.py
#                 (--only, --gpus, --quick). About 6 minutes on an H100.
#                 carry [".carry"]
#   recommenders  DLRM, DCNv2 (and Wide&Deep with --models ...,wide_deep) at Criteo scale against
#                 the all-in-HBM ceiling, through perf_analyzer (recsys_perf.py; its arguments).
#                 carry [".carry", ".carry_pa"]
#   dense         ResNet50, BERT-large, FastPitch served (eager and CUDA graphs) against the bare
#                 engine, through perf_analyzer (dense_perf.py; its arguments). The ONNX twins too
#                 when onnxruntime-gpu was unpacked by `ort` in the calls just before.
#                 carry [".carry", ".carry_pa"]
#   aoti MODEL    one model (resnet50, bert, dlrm_dense, dcnv2_dense, wide_deep_dense) as a CUDA FP16
#                 AOTInductor package exported in this call (examples/aoti_export.py) and as its
#                 TorchScript twin, both served with CUDA graphs per batch bucket, through
#                 perf_analyzer (gRPC, CUDA shared memory), against bare TorchScript (CUDA graph)
#                 and bare AOTInductor (aoti_bare, C++), with the targets PASS/MISS (aoti_perf.py;
#                 its arguments after MODEL); batch 1 of the package also through perf_analyzer's
#                 C API mode (the server in its process, no network). ResNet50 ~5 minutes, BERT-large
#                 ~7 (export included).
#                 carry [".carry", ".carry_pa"]
#   cache-check   the GPU cache against the CPU cache under both policies (LRU, LFU: every hit,
#                 row and insert the same), shared slots under concurrency, the hit path's speed
#                 (gpu_cache_check; also the second step of `models`). About a minute. carry [".carry"]
#   pooled-check  pooled (multi-hot) lookups on KIND_GPU (sum, mean, fp16 rows, ragged) exact against
#                 float64 sums of the stored rows, at MLPerf DLRM-v2's hotness, tables larger than
#                 their GPU cache; a served lookups/s figure (pooled_check.py). carry [".carry"]
#   pooled-bench  the pooled lookup alone over resident tables (every row in HBM): MLPerf DLRM-v2's 26
#                 tables at --scale (default 1.0, 52 GB fp16), batches of its 214 keys a sample pooled by
#                 one kernel from keys in GPU memory, uniform and Zipf keys, checked then timed
#                 (crates/embedding/examples/pooled_lookup_bench.rs; its arguments), then the bare PyTorch reference
#                 (F.embedding_bag per table, embedding_bag_ref.py) at the same batches. carry [".carry"]
#   dlrm-v2-check MLPerf's DLRM-v2 (examples/dlrm_v2.py, --scale of its rows) as one recommender on
#                 KIND_GPU, pooled lookups and a TorchScript network: predictions against the PyTorch
#                 reference on the GPU, and a served pairs/s figure (dlrm_v2_check.py). carry [".carry"]
#   dlrm-v2       MLPerf's DLRM-v2 benchmark (issue 46; dlrm_v2_perf.py, its arguments): the 26 tables at
#                 --scale (default 1.0: 204 M rows, 52 GB fp16) written by criteo_fixture, served as ONE
#                 recommender (GPU cache --cache, default 1.0 = every row in HBM; network a CUDA fp16
#                 AOTInductor package exported in this call, CUDA graphs, dynamic batching), checked
#                 against float64 sums and the PyTorch fp32 network, then perf_analyzer (gRPC, CUDA
#                 shared memory): 270-pair queries (-b 270) over --concurrency, MLPerf-like 100-700
#                 pairs per query through a non-batching ensemble twin, the pooled lookup alone; an
#                 endless stream (.carry/stream_client); after the server stops, with
#                 --capi-concurrency, 270-pair queries in-process through Triton's C API (no gRPC
#                 front end), then the bare PyTorch
#                 reference (F.embedding_bag + torch.compile'd network, all tables in HBM); ratios and
#                 the issue's targets PASS/MISS; README.md with tables and plots. About 9 minutes at
#                 scale 1.0 on an H100 (--quick: fewer points). With --cache below 1 its folder is
#                 dlrm-v2-cache<percent> (--cache 0.1: dlrm-v2-cache10).
#                 carry [".carry", ".carry_pa"]
#   dlrm-v2-network DLRM-v2's network alone: fp16, fp8 (per-tensor scales, calibrated inputs) and
#                 fp8-rows (per-row scales), compiled and as the AOTInductor package the recommender
#                 serves, timed by CUDA events at --batches, TFLOP/s against the peaks, each against the
#                 FP32 network (dlrm_v2_network.py; --packages fp8:triton,...: packages with the cross
#                 layers as our kernels, or :autotune with Inductor's max_autotune). carry [".carry"]
#   dlrm-v2-fair  fair ratios for DLRM-v2 (issue 65; dlrm_v2_fair.py, its arguments): at batch 16,384, for the
#                 FP8 and the fp16 network each, the served model as the headline run serves it (dlrm_v2_perf.py:
#                 6 instances, fused cross layers, every row in HBM; requests of 8,192 pairs through
#                 perf_analyzer and the endless stream) against the bare reference of the same precision: the
#                 same network module torch.compile'd as CUDA graphs plus F.embedding_bag over the same 26 fp16
#                 tables, one after the other and overlapped on several CUDA streams; the package alone
#                 (aoti_bare); ratios, TFLOP/s against each type's peak, accuracy against fp32 beside every
#                 figure. About 8 minutes on an H200. carry [".carry", ".carry_pa"]
#   aoti-check    FastPitch (FP32), ResNet50 and BERT-large (FP16, CUDA graphs) as CUDA AOTInductor
#                 packages exported in this call and served on KIND_GPU, checked rather than timed:
#                 answers in the body and written into CUDA shared memory equal to torch eager,
#                 out-of-range ids refused, sequences past a package's exported range refused with
#                 every model still answering, the packages' CUDA modules tracked (aoti_check.py; its
#                 arguments, e.g. --only fastpitch_aoti). About 4 minutes on an H100, exports most of it.
#                 carry [".carry"]
#   aoti-recsys   recommenders (default DLRM) as ONE model whose network is a CUDA FP16
#                 AOTInductor package (dense.pt2) at Criteo scale (recsys_perf.py --dense aoti;
#                 its arguments), keys in CUDA shared memory, the key pool sized for the hit rate.
#                 DLRM's interaction is a Triton kernel in the package (--aoti-dlrm-interaction),
#                 DCNv2's cross layers optionally (--dcnv2-cross triton); --stream-concurrency N[,M..]
#                 adds an endless stream at the cache's stationary hit rate (stream_load.py; its
#                 requests sent by .carry/stream_client, examples/stream_client.rs); --protocol
#                 grpc,http,grpc-streaming measures each run over each.
#                 carry [".carry", ".carry_pa"]
#   network       where the recommenders' dense networks spend their time, compiled by Inductor:
#                 eager and compiled timed, TFLOP/s, the heaviest kernels (network_profile.py; its
#                 arguments, e.g. --models dlrm --inductor max_autotune=true, --dlrm-forms,
#                 --dcnv2-forms, --cross-configs). carry [".carry"]
#   cross         DCNv2's cross-layer kernel alone in many configurations, timed and checked
#                 (cross_sweep.py; its arguments, e.g. --configs, --best-to FILE; --fp8: the FP8
#                 kernel beside the unfused FP8 layer). carry [".carry"]
#   trust reload torch|onnx|aoti|embedding [cycles] | soak | faults
#                 load/infer/unload cycles on KIND_GPU (reload_cycles.py; aoti: unpacked package
#                 folders left behind are counted too; its options after the cycles, e.g.
#                 `trust reload aoti 200 --model fastpitch --graphs`), 8 minutes of 256 clients
#                 (soak.py: needs the repository `models` leaves in /tmp/all_models on a still-warm
#                 machine), bad inputs and a device-side assert (gpu_faults.py).
#                 carry [".carry"]
#   dlrm-v3-check DLRM-v3 (issue 68) on the GPU in one call: the jagged attention kernel exact and
#                 timed against eager (dlrm_v3_kernel_check.py), the example model served on
#                 KIND_GPU from a CUDA package and checked against the reference
#                 (dlrm_v3_serve.py), then the network at the benchmark's shape, ours against the
#                 reference eager and compiled (dlrm_v3_network.py; its arguments). carry [".carry"]
#   dlrm-v3-serve the second step alone (dlrm_v3_serve.py; its arguments: --tables fp16, the rows
#                 as stored; --gpus 0,1 --sharded, the tables placed once over two GPUs, on
#                 nvidia-h200-x2). carry [".carry"]
#   dlrm-v3-network  that last step alone (dlrm_v3_network.py; its arguments). carry [".carry"]
#   dlrm-v3-blocks the attention kernel's blocks swept (dlrm_v3_kernel_check.py), then the network
#                 timed with the fastest (TRITON_RUST_HSTU_BLOCKS; dlrm_v3_network.py's arguments).
#                 carry [".carry"]
#   dlrm-v3-perf  DLRM-v3 at the benchmark's configuration served on KIND_GPU through a GPU cache,
#                 queries/s and p50/p99 by client count, beside the compiled reference in the same
#                 call (dlrm_v3_perf.py; its arguments: --cache 0.1,1.0, --fresh-users N, --stream,
#                 --item-rows N). carry
#                 [".carry"]; with ".carry_pa" too, perf_analyzer runs on each share as well
#   ort           gathers the onnxruntime-gpu parts carried by this call (pack.sh --ort) in
#                 /tmp/ort_parts; the call that brings the last one unpacks /tmp/ort. One call per
#                 part, carrying that part alone, consecutive (the machine keeps /tmp only while
#                 warm, ~30 s): carry [".carry_ort/ort-of-6.tar.zst.part-aa", ".carry_ort/tools"], ...
#
# Options (before the subcommand):
#   --results DIR          the results folder (default $OUT/BENCHMARK, or /tmp/out/BENCHMARK: the
#                          subcommand; aoti/MODEL for aoti; trust/reload_KIND, trust/soak, trust/faults
#                          for trust): the path its benchmark has under bench/gpu/results/ (README there)
#   --cpu-poll-idle[=yield|spin]   keep every CPU from halting while the run lasts (host_qos.py):
#                          a host tuning that a user's server does not have; off by default
#   --cpu-latency-qos      hold /dev/cpu_dma_latency at 0 us while the run lasts; off by default
#   --pack                 at the end, the results folder becomes one file, DIR.tgz (a device call
#                          returns eight files: several runs in one call each keep theirs whole)
#
# Each run writes ONE results folder: console.log (everything printed), host.txt (the GPU's name,
# driver and clocks from nvidia-smi; CPU model and count, cpuidle driver and governor, cpufreq
# governor, whether a CPU-polling helper ran; the backend library's checksum) and, for
# recommenders and dense, the benchmark's files in one archive (a device call returns at most
# 8 files). The device call, in full (one call; tritonserver is unpacked in the same call):
#
#   run(command="bash bench/gpu/run.sh models", carry=[".carry"], timeout_s=600)
#   run(command="bash bench/gpu/run.sh recommenders --models dlrm", carry=[".carry", ".carry_pa"])
#   run(command="bash bench/gpu/run.sh aoti resnet50", carry=[".carry", ".carry_pa"], timeout_s=600)
#   run(command="bash bench/gpu/run.sh aoti-recsys --models dlrm --paths one --batches 4096,65536 --alphas 1.2 "
#               "--concurrency 1 --shared-memory cuda --graphs", carry=[".carry", ".carry_pa"], timeout_s=600)
#   run(command="bash bench/gpu/run.sh trust reload aoti 200", carry=[".carry"], timeout_s=600)
#   run(command="bash bench/gpu/run.sh aoti-check", carry=[".carry"], timeout_s=600)
#   run(command="bash bench/gpu/run.sh --results $OUT/dlrm-v2/two_instances dlrm-v2", carry=[".carry", ".carry_pa"], timeout_s=600)
#   run(command="bash bench/gpu/run.sh dlrm-v2-network", carry=[".carry"], timeout_s=600)
#   run(command="bash bench/gpu/run.sh dlrm-v2 --cache 0.1", carry=[".carry", ".carry_pa"], timeout_s=600)
#   run(command="bash bench/gpu/run.sh dlrm-v2-fair", carry=[".carry", ".carry_pa"], timeout_s=600)
#
# The results come back under $OUT/<benchmark>/. Committed, they replace that benchmark's folder under
# bench/gpu/results/ whole (git rm -r it first; git keeps the history): one folder per benchmark,
# never one per attempt. A benchmark made of several calls names each call's folder with --results
# (bench/gpu/results/README.md lists them).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
usage() { sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }

results=""; poll=""; qos=0; pack=0
while [ $# -gt 0 ]; do
    case "$1" in
    --results) results="$2"; shift 2 ;;
    --results=*) results="${1#*=}"; shift ;;
    --cpu-poll-idle) poll=yield; shift ;;
    --cpu-poll-idle=*) poll="${1#*=}"; shift ;;
    --cpu-latency-qos) qos=1; shift ;;
    --pack) pack=1; shift ;;
    -h|--help) usage ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) break ;;
    esac
done
sub="${1:-}"; [ -n "$sub" ] || usage
shift
case "$sub" in models|cache-check|recommenders|dense|trust|ort|aoti|aoti-check|aoti-recsys|network|cross|pooled-check|pooled-bench|dlrm-v2-check|dlrm-v2|dlrm-v2-network|dlrm-v2-fair|dlrm-v3-check|dlrm-v3-serve|dlrm-v3-network|dlrm-v3-blocks|dlrm-v3-perf) ;; *) usage ;; esac

# ---- ort: gather a carried part; unpack once every part is here (no .carry needed) ----
if [ "$sub" = ort ]; then
    set -e
    mkdir -p /tmp/ort_parts /tmp/ort
    cp .carry_ort/ort-of-*.tar.zst.part-* /tmp/ort_parts/ 2>/dev/null || true
    [ -d .carry_ort/tools ] && cp .carry_ort/tools/* /tmp/ort_parts/
    first=$(ls /tmp/ort_parts/ort-of-*.tar.zst.part-* 2>/dev/null | head -1)
    [ -n "$first" ] || { echo "no onnxruntime-gpu part carried (bash bench/gpu/pack.sh --ort)" >&2; exit 1; }
    want=$(basename "$first" | sed -E 's/^ort-of-([0-9]+)\..*/\1/')
    have=$(ls /tmp/ort_parts/ort-of-*.tar.zst.part-* | wc -l)
    echo "onnxruntime-gpu parts here: $have of $want"
    if [ "$have" -ge "$want" ] && [ ! -f /tmp/ort/libonnxruntime.so.1.31.1 ]; then
        cat /tmp/ort_parts/ort-of-*.tar.zst.part-* | LD_LIBRARY_PATH=/tmp/ort_parts /tmp/ort_parts/zstd -d --long=27 -q -c |
            tar -C /tmp/ort -xf -
        ls -la /tmp/ort
    fi
    exit 0
fi

[ -f .carry/libtriton_rust.so ] || { echo "no .carry/ here: bash bench/gpu/pack.sh, and carry [\".carry\"]" >&2; exit 1; }
out="${OUT:-/tmp/out}"
# by default the folder is named for the benchmark, as under bench/gpu/results/
bench="$sub"
case "$sub" in
aoti) bench="aoti/${1:-}" ;;
trust) if [ "${1:-}" = reload ]; then bench="trust/reload_${2:-}"; else bench="trust/${1:-}"; fi ;;
dlrm-v2)
    # a run with part of the rows in the GPU cache has its own folder: --cache 0.1 -> dlrm-v2-cache10
    cache=$(printf '%s\n' "$@" | awk 'p { print; exit } $0 == "--cache" { p = 1 } /^--cache=/ { sub(/^--cache=/, ""); print; exit }')
    if [ -n "$cache" ]; then
        bench=$(awk -v c="$cache" 'BEGIN { if (c + 0 >= 1) print "dlrm-v2"; else printf "dlrm-v2-cache%d\n", c * 100 + 0.5 }')
    fi ;;
esac
res="${results:-$out/$bench}"
mkdir -p "$res"
if [ -z "${_RUN_SH_LOGGED:-}" ]; then
    # everything printed goes to the console and to console.log
    opts=(--results "$res")
    [ -n "$poll" ] && opts+=("--cpu-poll-idle=$poll")
    [ "$qos" = 1 ] && opts+=(--cpu-latency-qos)
    _RUN_SH_LOGGED=1 bash "$0" "${opts[@]}" "$sub" "$@" 2>&1 | tee "$res/console.log"
    rc="${PIPESTATUS[0]}"
    if [ "$pack" = 1 ]; then
        tar -C "$(dirname "$res")" -czf "$res.tgz" "$(basename "$res")" && rm -rf "$res" \
            && echo "run.sh: the results folder packed into $res.tgz"
    fi
    exit "$rc"
fi

# ---- the machine: tritonserver, CUDA libraries, the backend, perf_analyzer ----
PYT="${PYT:-/tmp/pyt}"
server="$PYT/pytriton/tritonserver/bin/tritonserver"
if [ ! -x "$server" ]; then
    mkdir -p "$PYT" && tar -C "$PYT" -xJf .carry/pyt.tar.xz || { echo "cannot unpack .carry/pyt.tar.xz" >&2; exit 1; }
fi
TORCH_DIR=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
SITE=$(dirname "$TORCH_DIR")
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:$TORCH_DIR/lib:$SITE/nvidia/cu13/lib:$SITE/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
backends=/tmp/rust_backends
mkdir -p "$backends/rust"
cp .carry/libtriton_rust.so .carry/libtriton_rust_torch.so .carry/libtriton_rust_torch_cuda.so "$backends/rust/"
# the AOTInductor plugin, where pack.sh built it
[ -f .carry/libtriton_rust_aoti.so ] && cp .carry/libtriton_rust_aoti.so "$backends/rust/"
aoti=0
case "$sub" in aoti|aoti-recsys|dlrm-v2|dlrm-v2-fair) aoti=1 ;; trust) [ "${1:-}" = reload ] && [ "${2:-}" = aoti ] && aoti=1 ;; esac
if [ "$aoti" = 1 ] && [ ! -f "$backends/rust/libtriton_rust_aoti.so" ]; then
    echo "no .carry/libtriton_rust_aoti.so: bash bench/gpu/pack.sh (with the triton_rust_aoti crate)" >&2; exit 1
fi
export PYTHONUNBUFFERED=1
pa=/tmp/pa/perf_analyzer/bin/perf_analyzer
if [ "$sub" = recommenders ] || [ "$sub" = dense ] || [ "$sub" = aoti ] || [ "$sub" = aoti-recsys ] || [ "$sub" = dlrm-v2 ] || [ "$sub" = dlrm-v2-fair ]; then
    if [ ! -x "$pa" ]; then
        ls .carry_pa/perf_analyzer-*.whl >/dev/null 2>&1 || { echo "no .carry_pa/: carry [\".carry\", \".carry_pa\"]" >&2; exit 1; }
        python3 -m pip install --quiet --no-index --no-deps --target /tmp/pa .carry_pa/perf_analyzer-*.whl
    fi
fi
# DLRM-v3's benchmark runs perf_analyzer too when .carry_pa is carried (optional there)
if [ "$sub" = dlrm-v3-perf ] && [ ! -x "$pa" ] && ls .carry_pa/perf_analyzer-*.whl >/dev/null 2>&1; then
    python3 -m pip install --quiet --no-index --no-deps --target /tmp/pa .carry_pa/perf_analyzer-*.whl
fi
ort_lib=/tmp/ort/libonnxruntime.so.1.31.1
# the bare AOTInductor reference: carried (pack.sh), else built here against this torch
aoti_bare=/tmp/aoti_bare
if { [ "$sub" = aoti ] || [ "$sub" = aoti-recsys ] || [ "$sub" = dlrm-v2-network ] || [ "$sub" = dlrm-v2-fair ]; } && [ ! -x "$aoti_bare" ]; then
    if [ -x .carry/aoti_bare ]; then
        cp .carry/aoti_bare "$aoti_bare"
    else
        t0=$(date +%s)
        bash bench/gpu/build_aoti_bare.sh "$TORCH_DIR" "$aoti_bare" || { echo "cannot build aoti_bare" >&2; exit 1; }
        echo "aoti_bare built in $(( $(date +%s) - t0 )) s"
    fi
fi

# ---- the host helper, only when asked ----
helper="none"
if [ -n "$poll" ] || [ "$qos" = 1 ]; then
    hargs=()
    [ -n "$poll" ] && hargs+=(--cpu-poll-idle "$poll")
    [ "$qos" = 1 ] && hargs+=(--cpu-latency-qos)
    python3 bench/gpu/host_qos.py "${hargs[@]}" &
    helper_pid=$!
    trap 'kill "$helper_pid" 2>/dev/null' EXIT
    helper="host_qos.py ${hargs[*]} (pid $helper_pid)"
fi

# ---- open files: raised to the hard limit (the server holds a socket per client connection;
# gRPC runs at concurrency 128 and more met "Connection reset by peer"); host.txt says both
nofile_was=$(ulimit -Sn)
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ---- host facts ----
{
    echo "run.sh $sub $*"
    echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M')"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.max.sm,clocks.max.mem --format=csv,noheader
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs$(grep -qm1 hypervisor /proc/cpuinfo && echo ', virtual machine')"
    d=/sys/devices/system/cpu
    echo "cpuidle driver: $(cat $d/cpuidle/current_driver 2>/dev/null || echo none), governor: $(cat $d/cpuidle/current_governor_ro $d/cpuidle/current_governor 2>/dev/null | head -1 || true)"
    echo "cpufreq governor: $(cat $d/cpu0/cpufreq/scaling_governor 2>/dev/null || echo none)"
    echo "memory: $(free -g | awk '/^Mem:/{print $2}') GiB; kernel $(uname -r)"
    echo "CPU-polling helper: $helper"
    echo "open files: soft limit $(ulimit -Sn) (was $nofile_was), hard $(ulimit -Hn); net.core.somaxconn $(cat /proc/sys/net/core/somaxconn 2>/dev/null || echo ?)"
    echo "torch: $(python3 -c 'import torch; print(torch.__version__, "cuDNN", torch.backends.cudnn.version())')"
    echo "onnxruntime-gpu: $([ -f $ort_lib ] && echo $ort_lib || echo absent)"
    echo "backend environment: $(env | grep -E '^TRITON_RUST_[A-Z0-9_]+=' | sort | tr '\n' ' ')"
    echo "backend: libtriton_rust.so md5 $(md5sum .carry/libtriton_rust.so | cut -c1-12)$([ -f .carry/libtriton_rust_aoti.so ] && echo ", libtriton_rust_aoti.so md5 $(md5sum .carry/libtriton_rust_aoti.so | cut -c1-12)")"
} > "$res/host.txt" 2>&1
cat "$res/host.txt"

# perf_analyzer's C API mode (aoti, dlrm-v2 --capi-concurrency): libtritonserver.so (the wheel's
# hashed name, beside the libraries it needs) under lib/, this backend under backends/
capi=/tmp/capi
capi_dir() {
    mkdir -p "$capi/lib"
    for f in "$PYT"/nvidia_pytriton.libs/*; do ln -sf "$f" "$capi/lib/"; done
    ln -sf "$(ls "$PYT"/nvidia_pytriton.libs/libtritonserver-*.so | head -1)" "$capi/lib/libtritonserver.so"
    ln -sfn "$backends" "$capi/backends"
}

ort_args=()
rc=0
case "$sub" in
models)
    [ -f "$ort_lib" ] && ort_args=(--ort-lib "$ort_lib")
    echo "== all six models vs torch eager"
    python3 bench/gpu/all_models.py --server "$server" --backends "$backends" "${ort_args[@]}" "$@" || rc=1
    echo "== GPU cache: policy equivalence with the CPU cache, and the hit path"
    .carry/gpu_cache_check || rc=1
    echo "== the store on a GPU instance of tritonserver"
    python3 bench/gpu/embedding_store.py --server "$server" --backends "$backends" || rc=1
    ;;
cache-check)
    .carry/gpu_cache_check "$@" || rc=1
    ;;
recommenders)
    vmstat -t 5 > "$res/vmstat.log" 2>&1 &
    vm=$!
    nvidia-smi dmon -s puc -d 2 -o T > "$res/gpu_dmon.log" 2>&1 &
    dm=$!
    OUT="$res" ${RECSYS_TIMEOUT:+timeout "$RECSYS_TIMEOUT"} python3 bench/gpu/recsys_perf.py --server "$server" \
        --backends "$backends" --perf-analyzer "$pa" --fixture-bin .carry/criteo_fixture \
        --libtorch-dir "$TORCH_DIR/lib" "$@" || rc=1
    kill "$vm" "$dm" 2>/dev/null
    if grep -q "timing:" "$res/recsys/server.log" 2>/dev/null; then
        python3 bench/gpu/timing_summary.py "$res/recsys/server.log" > "$res/recsys/timing_summary.txt"
    fi
    # a verbose server log is too big to come back whole: keep its end
    if [ "$(stat -c %s "$res/recsys/server.log" 2>/dev/null || echo 0)" -gt 4000000 ]; then
        tail -c 2000000 "$res/recsys/server.log" > "$res/recsys/server_tail.log" && rm "$res/recsys/server.log"
    fi
    mv "$res/vmstat.log" "$res/gpu_dmon.log" "$res/recsys/" 2>/dev/null
    [ -d "$res/recsys" ] && tar -C "$res" -czf "$res/recsys.tgz" recsys && rm -rf "$res/recsys"
    ;;
dense)
    [ -f "$ort_lib" ] && ort_args=(--ort-lib "$ort_lib" --ort-bare .carry/ort_bare)
    OUT="$res" timeout "${DENSE_TIMEOUT:-3600}" python3 bench/gpu/dense_perf.py "${ort_args[@]}" --server "$server" \
        --backends "$backends" --perf-analyzer "$pa" "$@" || rc=1
    [ -d "$res/perf" ] && tar -C "$res" -czf "$res/perf.tgz" perf && rm -rf "$res/perf"
    ;;
aoti)
    model="${1:?aoti MODEL (resnet50, bert, dlrm_dense, dcnv2_dense, wide_deep_dense)}"; shift
    capi_dir
    # the GPU's SM clock, power and use every second (did its clocks fall between batch-1 requests?)
    nvidia-smi dmon -s puc -d 1 -o T > "$res/gpu_dmon.log" 2>&1 &
    dm=$!
    # the call's 600 s: aoti_perf.py skips perf_analyzer runs past its --budget-s (default 480)
    OUT="$res" timeout "${AOTI_TIMEOUT:-560}" python3 bench/gpu/aoti_perf.py --model "$model" --server "$server" \
        --backends "$backends" --perf-analyzer "$pa" --aoti-bare "$aoti_bare" --libtorch-dir "$TORCH_DIR/lib" --capi-dir "$capi" "$@" || rc=1
    kill "$dm" 2>/dev/null
    [ -f "$res/perf/report.md" ] && cp "$res/perf/report.md" "$res/report.md"
    # the dmon samples go into the archive (a device call returns at most 8 files)
    [ -d "$res/perf" ] && mv "$res/gpu_dmon.log" "$res/perf/" 2>/dev/null
    [ -d "$res/perf" ] && tar -C "$res" -czf "$res/perf.tgz" perf && rm -rf "$res/perf"
    ;;
network)
    timeout "${NETWORK_TIMEOUT:-570}" python3 bench/gpu/network_profile.py "$@" || rc=1
    ;;
cross)
    timeout "${CROSS_TIMEOUT:-570}" python3 bench/gpu/cross_sweep.py "$@" || rc=1
    ;;
pooled-check)
    timeout "${POOLED_TIMEOUT:-570}" python3 bench/gpu/pooled_check.py --server "$server" \
        --backends "$backends" "$@" || rc=1
    ;;
pooled-bench)
    # the kernel alone, then in the same call the bare PyTorch reference at the same batches
    # (the tables of one are freed before the other's are made)
    timeout "${POOLED_TIMEOUT:-300}" .carry/pooled_lookup_bench "$@" || rc=1
    timeout 240 python3 bench/gpu/embedding_bag_ref.py "$@" || rc=1
    ;;
dlrm-v2-network)
    timeout "${NETWORK_TIMEOUT:-570}" python3 bench/gpu/dlrm_v2_network.py --results "$res" --aoti-bare "$aoti_bare" "$@" || rc=1
    ;;
dlrm-v2-check)
    timeout "${DLRM_V2_TIMEOUT:-570}" python3 bench/gpu/dlrm_v2_check.py --server "$server" \
        --backends "$backends" "$@" || rc=1
    ;;
dlrm-v2)
    # the GPU's clocks, power and use every 2 s, into the benchmark's work folder: dlrm_v2_perf.py
    # packs it into perf.tgz with the raw CSVs (a device call returns at most 8 files)
    work=/tmp/dlrm_v2
    mkdir -p "$work"
    capi_dir  # for --capi-concurrency
    nvidia-smi dmon -s puc -d 2 -o T > "$work/gpu_dmon.log" 2>&1 &
    dm=$!
    OUT="$res" timeout "${DLRM_V2_TIMEOUT:-570}" python3 bench/gpu/dlrm_v2_perf.py --server "$server" \
        --backends "$backends" --perf-analyzer "$pa" --fixture-bin .carry/criteo_fixture \
        --stream-client .carry/stream_client --libtorch-dir "$TORCH_DIR/lib" --results "$res" --work "$work" --capi-dir "$capi" \
        --command "bash bench/gpu/run.sh dlrm-v2 $*" "$@" || rc=1
    kill "$dm" 2>/dev/null
    ;;
dlrm-v2-fair)
    # everything in one call: the device's 600 s less this script's unpacking (--deadline-s, 550 s by default)
    work=/tmp/dlrm_v2_fair
    mkdir -p "$work"
    # the GPU's clocks, power and use every 2 s, into the work folder: dlrm_v2_fair.py packs it into call.tgz
    nvidia-smi dmon -s puc -d 2 -o T > "$work/gpu_dmon.log" 2>&1 &
    dm=$!
    OUT="$res" timeout "${DLRM_V2_TIMEOUT:-575}" python3 bench/gpu/dlrm_v2_fair.py --server "$server" \
        --backends "$backends" --perf-analyzer "$pa" --fixture-bin .carry/criteo_fixture \
        --stream-client .carry/stream_client --aoti-bare "$aoti_bare" --libtorch-dir "$TORCH_DIR/lib" \
        --results "$res" --work "$work" --command "bash bench/gpu/run.sh dlrm-v2-fair $*" "$@" || rc=1
    kill "$dm" 2>/dev/null
    ;;
dlrm-v3-check)
    OUT="$res" timeout 240 python3 bench/gpu/dlrm_v3_kernel_check.py || rc=1
    OUT="$res" timeout 170 python3 bench/gpu/dlrm_v3_serve.py --server "$server" --backends "$backends" || rc=1
    OUT="$res" timeout "${NETWORK_TIMEOUT:-240}" python3 bench/gpu/dlrm_v3_network.py "$@" || rc=1
    ;;
dlrm-v3-serve)
    OUT="$res" timeout "${SERVE_TIMEOUT:-300}" python3 bench/gpu/dlrm_v3_serve.py --server "$server" --backends "$backends" "$@" || rc=1
    ;;
dlrm-v3-perf)
    pa_args=()
    [ -x "$pa" ] && pa_args=(--perf-analyzer "$pa")
    OUT="$res" timeout "${PERF_TIMEOUT:-560}" python3 bench/gpu/dlrm_v3_perf.py --server "$server" --backends "$backends" "${pa_args[@]}" "$@" || rc=1
    ;;
dlrm-v3-network)
    OUT="$res" timeout "${NETWORK_TIMEOUT:-400}" python3 bench/gpu/dlrm_v3_network.py "$@" || rc=1
    ;;
dlrm-v3-blocks)
    # the attention kernel's blocks swept (the defaults among them), then the network timed
    # with the fastest within the bound (its reference in the same run)
    OUT="$res" timeout 240 python3 bench/gpu/dlrm_v3_kernel_check.py || rc=1
    best=$(sed -n 's/^fastest blocks within the bound: .*TRITON_RUST_HSTU_BLOCKS=\([^ ]*\)$/\1/p' "$res/dlrm_v3_kernel_check.txt" 2>/dev/null | tail -1)
    if [ -n "$best" ]; then
        TRITON_RUST_HSTU_BLOCKS="$best" OUT="$res" timeout "${NETWORK_TIMEOUT:-320}" python3 bench/gpu/dlrm_v3_network.py "$@" || rc=1
    else
        echo "no blocks within the bound: the network not timed" >&2; rc=1
    fi
    ;;
aoti-check)
    OUT="$res" timeout "${AOTI_TIMEOUT:-570}" python3 bench/gpu/aoti_check.py --server "$server" \
        --backends "$backends" --libtorch-dir "$TORCH_DIR/lib" "$@" || rc=1
    ;;
aoti-recsys)
    nvidia-smi dmon -s puc -d 2 -o T > "$res/gpu_dmon.log" 2>&1 &
    dm=$!
    OUT="$res" timeout "${RECSYS_TIMEOUT:-570}" python3 bench/gpu/recsys_perf.py --dense aoti --aoti-bare "$aoti_bare" \
        --server "$server" --backends "$backends" --perf-analyzer "$pa" --fixture-bin .carry/criteo_fixture \
        --libtorch-dir "$TORCH_DIR/lib" "$@" || rc=1
    kill "$dm" 2>/dev/null
    if [ "$(stat -c %s "$res/recsys/server.log" 2>/dev/null || echo 0)" -gt 4000000 ]; then
        tail -c 2000000 "$res/recsys/server.log" > "$res/recsys/server_tail.log" && rm "$res/recsys/server.log"
    fi
    mv "$res/gpu_dmon.log" "$res/recsys/" 2>/dev/null
    [ -d "$res/recsys" ] && tar -C "$res" -czf "$res/recsys.tgz" recsys && rm -rf "$res/recsys"
    ;;
trust)
    what="${1:-}"; shift || true
    case "$what" in
    reload)
        kind="${1:?reload torch|onnx|aoti|embedding}"; cycles="${2:-200}"
        python3 bench/gpu/reload_cycles.py --server "$server" --backends "$backends" --kind "$kind" \
            --cycles "$cycles" "${@:3}" --ort-lib "$ort_lib" || rc=1 ;;
    soak) python3 bench/gpu/soak.py --server "$server" --backends "$backends" "$@" || rc=1 ;;
    faults) python3 bench/gpu/gpu_faults.py --server "$server" --backends "$backends" "$@" || rc=1 ;;
    *) echo "trust reload torch|onnx|aoti|embedding [cycles] | soak | faults" >&2; rc=2 ;;
    esac
    ;;
esac
echo "run.sh $sub: exit $rc; results in $res"
exit "$rc"
