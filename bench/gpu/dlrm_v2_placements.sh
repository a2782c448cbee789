#!/usr/bin/env bash
# Issue 47 on one two-GPU device call: MLPerf DLRM-v2 (scale 1.0, every row in HBM, FP8
# network, 4 instances a GPU) served sharded over two GPUs, replicated on the same two, and
# replicated on one (GPU 0), and sharded with fp32 rows (104 GB: more than one H100 holds),
# with the small tables copied to every GPU (gpucache_sharded_replicate 0.0625, the earlier default), every table once
# (sharded_01_fp32_once) or more copied (sharded_01_fp32_hot: gpucache_sharded_replicate 0.35,
# which on two H200s copies t20 and t21 too; sharded_01_fp32_hot_h100: the same with at most 71 GB of
# rows a GPU, an H100 80GB's room (its 85.5 GB less the context and the 15% kept free), so that larger
# GPUs make the plan two H100s would: t20 and t10 copied, t0, t9, t19 and t21 two a GPU), and replicated with fp32 rows at half MLPerf's rows (52 GB, which
# one GPU holds: replicated_01_fp32_half), those --runs names, one after the other on one machine; a run the call's time cannot hold
# is skipped. Each run is
# bench/gpu/run.sh dlrm-v2 (its exactness check first: pooled rows against float64 sums,
# predictions against PyTorch, the requests sent at once so every GPU answers some), packed
# into <run>.tgz; then placements_summary.py prints the ratios into summary.txt beside
# topo.txt (nvidia-smi topo -m). The clients' inputs stay on GPU 0 (CUDA shared memory).
# No bare PyTorch reference: the issue's ratios are between these runs.
#
#   bash bench/gpu/pack.sh        # then, on the device (kind nvidia-h100-x2), carry .carry and .carry_pa:
# --rounds N runs the list N times in turn (A B A B ...), a later round's runs named <run>_r2, ...,
# so that each ratio is measured more than once in one call (placements_summary prints each round's).
# `-- --big-concurrency 4,8 --big-pairs 4096` adds requests larger than MLPerf's queries, whose rate
# the queries a second through the front end do not hold: placements_summary prints their ratios
# (how the GPUs themselves scale) beside the rest. Not yet run: perf_analyzer keeps each request's
# inputs in GPU memory (7 MB at 4096 pairs), which on an H100 the tables and 6 instances left no
# room for at 8192 pairs (bench/gpu/results/dlrm-v2/front_end/). `-- --capi-concurrency 256,512,768`
# adds 270-pair queries in-process through Triton's C API (no gRPC front end), also printed apart;
# on two GPUs perf_analyzer's C API mode puts its inputs on one GPU and labels them GPU 0's, which
# fails the requests when that GPU is not GPU 0 (bench/gpu/results/dlrm-v2/thirty_two_cores/).
#
#   bash bench/gpu/dlrm_v2_placements.sh [--deadline-s 570] [--least-s 100 (a run starts with this much left)] [--rounds 1] [--runs sharded_01_fp32,replicated_01] [--results DIR] \
#       [-- more dlrm-v2 arguments for every run, e.g. --server-arg=--log-verbose=1]
set -u
cd "$(dirname "$0")/../.."
deadline=570
least=100
rounds=1
runs="sharded_01_fp32,replicated_01,replicated_0,sharded_01"
out="${OUT:-/tmp/out}/dlrm-v2/placements"
while [ $# -gt 0 ]; do
    case "$1" in
    --deadline-s) deadline="$2"; shift 2 ;;
    --least-s) least="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --results) out="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
t0=$(date +%s)
mkdir -p "$out"
nvidia-smi topo -m > "$out/topo.txt" 2>&1
nvidia-smi --query-gpu=index,name,memory.total --format=csv >> "$out/topo.txt" 2>&1
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if [ "$gpus" -lt 2 ]; then
    echo "dlrm_v2_placements.sh needs two GPUs; this machine has $gpus" | tee "$out/summary.txt"
    exit 1
fi
A=(--network-precision fp8 --instances 4 --max-queue-delay-us 1000
   --graph-batches 2048,4096,6144,8192,10240,12288,14336,16384 --concurrency 0 --mlperf-concurrency 128,256
   --lookup-concurrency 0 --stream-concurrency 128,256 --stream-seconds 5 --interval-ms 2000
   --no-reference --quick "$@")
rc=0
# name, the seconds it may take at most (the first pays the tables and the export), its own arguments
run() {
    local name="$1$suffix" most="$2"; shift 2
    local left=$(( deadline - ($(date +%s) - t0) ))
    if [ "$left" -lt "$least" ]; then
        echo "== $name: skipped, ${left} s left of the call's ${deadline}" | tee -a "$out/skipped.txt"
        return
    fi
    local budget=$(( left - 20 < most ? left - 20 : most ))
    echo "== $name (--budget-s $budget, $(( $(date +%s) - t0 )) s into the call)"
    bash bench/gpu/run.sh --pack --results "$out/$name" dlrm-v2 "${A[@]}" "$@" --budget-s "$budget" || rc=1
}
# the first run at each scale pays its tables (and the first, the export): about 100 s on a fresh machine
written=""
for round in $(seq 1 "$rounds"); do
    suffix=$([ "$round" -gt 1 ] && echo "_r$round")
    for name in ${runs//,/ }; do
        scale=$([ "$name" = replicated_01_fp32_half ] && echo 0.5 || echo 1.0)
        first=$(case " $written " in *" $scale "*) echo 130 ;; *) echo 300 ;; esac)
        written="$written $scale"
        case "$name" in
        sharded_01_fp32) run "$name" "$first" --gpus 0,1 --placement sharded --cache-rows fp32 --replicate-share 0.0625 ;;
        sharded_01_fp32_once) run "$name" "$first" --gpus 0,1 --placement sharded --cache-rows fp32 --replicate-share 0 ;;
        sharded_01_fp32_hot) run "$name" "$first" --gpus 0,1 --placement sharded --cache-rows fp32 --replicate-share 0.35 ;;
        sharded_01_fp32_hot_h100) run "$name" "$first" --gpus 0,1 --placement sharded --cache-rows fp32 --replicate-share 0.35 --sharded-memory-gb 71 ;;
        sharded_01) run "$name" "$first" --gpus 0,1 --placement sharded --replicate-share 0.0625 ;;
        replicated_01) run "$name" "$first" --gpus 0,1 ;;
        replicated_0) run "$name" "$first" --gpus 0 ;;
        replicated_01_fp32_half) run "$name" "$first" --gpus 0,1 --cache-rows fp32 --scale 0.5 ;;
        *) echo "unknown run: $name" >&2; rc=1 ;;
        esac
    done
done
python3 bench/gpu/placements_summary.py "$out" | tee "$out/summary.txt"
exit "$rc"
