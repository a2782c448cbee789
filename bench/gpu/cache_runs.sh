#!/usr/bin/env bash
# MLPerf DLRM-v2 (scale 1.0, 52 GB of fp16 rows) under the endless stream of fresh keys, served
# several ways in ONE device call, so that every ratio between them (the 10% cache against every
# row in HBM, one miss path against another) comes from one machine at one time (issue 66). The
# tables are written once (the first run pays them and the export: ~100 s), each later run is a
# fresh tritonserver on the same tables (~60-80 s). Each run is bench/gpu/run.sh dlrm-v2 with the
# headline's arguments (FP8 network, 6 instances, queries of 8,192 pairs, 24 in flight, LFU) and
# the run's own; its folder is packed into <run>.tgz; summary.txt has every run's stream line,
# hit rate, host CPU and the backend's per-batch steps (--timing), and the ratios to `hbm`.
#
#   bash bench/gpu/pack.sh     # then, on the device, carry [".carry", ".carry_pa"]:
#   bash bench/gpu/cache_runs.sh [--deadline-s 560] [--runs hbm,mapped,huge] [--results DIR] [-- more dlrm-v2 arguments]
#
# Runs: hbm (every row in HBM), mapped (10% cache, host rows in the files' mapping), huge (10%
# cache, host rows copied into 2 MiB pages), huge12 (huge, 12 instances), gpu (10% cache, misses
# read by the GPU in place), both (10% cache, misses shared between the GPU in place and host
# threads), auto (10% cache, the store's defaults: what a user gets), auto8 and auto12 (auto, 8 or
# 12 instances), quietlN (quiet, N lanes a key of the batch lookup), quietc99 (quiet, a cache of 99% of the rows), quietlru / quietc99lru (quiet / quietc99 under LRU), quietslots / quietc99slots (quiet / quietc99 with no key index: gpucache_key_index off, the probe reading every key's set of tags), quietindex / quietc99index (every cache with a key index: gpucache_key_index on), quietc99nostamp / quietnostamp (quietc99 / quiet, the probe's hits not stamped: gpucache_hit_stamp_every 0), quietevery8 / quietc99every8 (one hit in 8 stamped), quietsN (quiet, N shares a reader of a batch's misses), hbmb32 / quietb32 (hbm / quiet, batches of up to 32,768 pairs, 48 queries in flight), hbmfifo / quietfifo (the instances' networks one after another on the GPU), quietniceN (quiet, the reader crew at niceness N), plainquiet / plainquietsN (plain with the crew asleep between jobs, as served quiet; N shares a reader), <run>trace (the run with every kernel the server runs traced: what ran beside what, <run>.trace.txt), quiet / asleep / asleep12 / quiet12 / quiet12c36 / hbmquiet (nothing spinning while it
# waits; see below), quiet8 (quiet, 8 instances), quietrN (quiet, N readers), quietyield / quietblock (quiet, every
# CUDA wait yielding or asleep; quietblockN with N instances), rowsquiet (quiet, the rows written out before pooling, as before), quietonce
# (quiet, each missed row of a batch read once), quiet270 (quiet, queries of 270 pairs), quietparts2
# (quiet, each batch in two parts), bothquiet (quiet, misses shared between host threads and the GPU
# reading in place on a few SMs; bothquiet2: on 2 blocks a kernel), bothyield (bothquiet with the GPU's reads
# on short blocks below the network's priority), pool8 / pool12 / pool32 (auto, the worker pool at 8, 12 or 32 threads), parts2 (auto, each batch in two parts: one part's misses read while the network
# runs on the other), saved / restart / cold (a warm restart against a cold start, below).
# A device call returns at most eight files: the runs' folders and logs come back packed in
# runs.tgz, beside summary.txt. `grid` is no server: miss_reads_bench times the GPU's in-place
# reads alone on grids of 4 to 32 blocks and on a warp for every four misses (grid.txt; run it
# first, its table leaves /dev/shm before the runs' tables come). `plain` is no server: served_reads_bench reads a 16 GB fp16 table
# in 2 MiB pages on the host alone, plain gathers on every core beside the store's reads
# (plain.txt): one starting its threads for each batch, and a steady one whose threads never
# pause (the host's rate); the summary sets each run's misses read a second against both, issue
# 66's first target against the steady one (the same call). It is taken from .carry_tools/ or .carry/; the
# three carries together pass a call's 64 MiB, so for `plain` copy it into .carry and set aside
# what these runs do not use (as the call of 2026-11-30 did, 63 MiB with a 22 MB working tree):
#   cp .carry_tools/served_reads_bench .carry/ && mkdir -p /tmp/aside &&
#   mv .carry/{aoti_bare,ort_bare,pooled_lookup_bench,gpu_cache_check,pool_slots_check} /tmp/aside/
set -u
cd "$(dirname "$0")/../.."
deadline=560
least=90
runs="hbm,mapped,huge"
out="${OUT:-/tmp/out}/cache-runs"
while [ $# -gt 0 ]; do
    case "$1" in
    --deadline-s) deadline="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --results) out="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
t0=$(date +%s)
# every run's GPU batch lookups time how long they hold the caches' queue (the timing lines'
# `queue lookup` and `queue fill`; the summary says how busy the queue was)
export TRITON_RUST_TIME_QUEUE=1
rm -rf "$out"; mkdir -p "$out/runs"
final="$out"; out="$out/runs"
# the host as the call found it (CPU model, cores and threads, NUMA, caches), beside the runs
lscpu > "$out/lscpu.txt" 2>&1 || true
A=(--allocation lookups --cache-policy lfu --stream-fresh --network-precision fp8 --dcnv2-cross triton
   --instances 6 --max-queue-delay-us 1000 --graph-batches 2048,4096,6144,8192,10240,12288,14336,16384
   --concurrency 0 --mlperf-concurrency 0 --lookup-concurrency 0 --big-concurrency 0
   --stream-concurrency 24 --stream-pairs 8192 --interval-ms 2000 --no-reference --timing --quick "$@")
rc=0
first=1
left_s() { echo $(( deadline - ($(date +%s) - t0) )); }
# a carried program (.carry_tools/ or .carry/) on the host alone, no server: tool NAME PROGRAM
# MOST_S FILE ARGS..., its output into FILE; fails (and says why) when it is not carried or the
# call has under 60 s left
tool() {
    local name="$1" prog="$2" most="$3" file="$4"; shift 4
    local left b
    left=$(left_s)
    b=$(ls ".carry_tools/$prog" ".carry/$prog" 2>/dev/null | head -1)
    if [ -z "$b" ] || [ "$left" -lt 60 ]; then
        echo "== $name: skipped (${b:-no $prog carried}; ${left} s left of the call's ${deadline})" | tee -a "$out/skipped.txt"
        return 1
    fi
    echo "== $name ($b, $(( $(date +%s) - t0 )) s into the call)"
    timeout $(( left - 5 < most ? left - 5 : most )) "$b" "$@" > "$out/$file" 2>&1 || { rc=1; return 1; }
}
run() {
    local name="$1$extra"; shift
    local left
    left=$(left_s)
    if [ "$left" -lt "$least" ]; then
        echo "== $name: skipped, ${left} s left of the call's ${deadline}" | tee -a "$out/skipped.txt"
        return
    fi
    # the stream starts only with 160 s of --budget-s left (recsys/dlrm_v2_stream.py's stream_room_s); a run
    # on tables already written takes 60-80 s of it
    local budget=$(( first ? 330 : 230 ))
    [ "$budget" -gt $(( left + 150 )) ] && budget=$(( left + 150 ))
    first=0
    echo "== $name (--budget-s $budget, $(( $(date +%s) - t0 )) s into the call)"
    # the bus's traffic, a sample a second, while the run serves
    nvidia-smi dmon -s tu -o T -d 1 > "$out/$name.dmon.txt" 2>&1 &
    local dmon=$!
    timeout $(( left - 5 )) bash bench/gpu/run.sh --pack --results "$out/$name" dlrm-v2 "${A[@]}" "$@" --budget-s "$budget" \
        > "$out/$name.log" 2>&1 || rc=1
    kill "$dmon" 2>/dev/null; wait "$dmon" 2>/dev/null
    # where the store put the host rows (host_memory auto decides at load; the server's log says)
    local log=/tmp/dlrm_v2/server.log
    [ -f "$log" ] && echo "host rows: $(grep -c 'raw bytes, copied into 2 MiB pages' "$log") tables copied into 2 MiB pages; $(grep -c 'not copied into 2 MiB pages' "$log") read from the files' mapping: $(grep -m1 -o 'not copied into 2 MiB pages: .*' "$log" | cut -c1-160)" >> "$out/$name.log"
    grep -E "M pairs/s|CPU:|tables in|host_memory|host rows:|FAIL|exit" "$out/$name.log" | sed "s/^/  /"
}
# every kernel tritonserver runs, its start and end on the GPU (bench/gpu/kernel_trace.c through
# CUDA's injection hook, with the CUPTI of the torch here), summarized by kernel_trace.py into
# <run>.trace.txt: what the GPU ran beside what over the steady stretch
trace_on() {
    local lib
    lib=$(python3 -c "
import glob, os
roots = []
try:
    import torch
    roots.append(os.path.dirname(os.path.dirname(torch.__file__)) + '/nvidia/*/lib/')
except ImportError:
    pass
found = [f for r in roots for f in sorted(glob.glob(r + 'libcupti.so.*'))]
print((found + sorted(glob.glob('/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so.*')) + [''])[0])" 2>/dev/null)
    echo "== $1: every kernel traced (CUPTI: ${lib:-none found})"
    export CUDA_INJECTION64_PATH="$PWD/.carry/libkernel_trace.so" TRITON_RUST_KERNEL_TRACE="/tmp/kernel_trace_$1.bin" \
        TRITON_RUST_CUPTI="$lib"
}
trace_off() {
    unset CUDA_INJECTION64_PATH TRITON_RUST_KERNEL_TRACE TRITON_RUST_CUPTI
    local f="/tmp/kernel_trace_$1.bin"
    if [ -s "$f" ]; then
        python3 bench/gpu/kernel_trace.py "$f" > "$out/$1.trace.txt" 2>&1 || rc=1
        sed "s/^/  /" "$out/$1.trace.txt"
    else
        echo "  $1: no kernel trace written" | tee "$out/$1.trace.txt"
    fi
    rm -f "$f"
}
for name in ${runs//,/ }; do
    # any run with `streaming` after its name: the same run with the readers' rows stored past
    # the CPU's caches (TRITON_RUST_MISS_STORES=streaming, the rule until 2026-11-30), in
    # <name>streaming/; with `cached` after it, through them (the default since), as the call
    # of 2026-11-30 15:01 named its runs
    # <name>trace: the same run with every kernel the server runs recorded (trace_on below)
    extra=""; base="$name"
    case "$name" in *cached) extra=cached ;; *streaming) extra=streaming ;; *trace) extra=trace ;; esac
    base="${name%"$extra"}"
    unset TRITON_RUST_MISS_STORES
    case "$extra" in
    cached|streaming) export TRITON_RUST_MISS_STORES="$extra" ;;
    trace) trace_on "$name" ;;
    esac
    case "$base" in
    # the table on the disk (/tmp): /dev/shm holds the runs' 52 GB fixture
    # plainquiet: the store's reader crew asleep between jobs, as served quiet; plainquietsN: N
    # shares a reader (TRITON_RUST_READ_SHARES; 2 otherwise); the table kept for the next plain run
    plain|plainquiet|plainquiets[0-9]*)
           spin=""; [ "$base" != plain ] && spin=0
           shares=""; case "$base" in plainquiets*) shares=${base#plainquiets} ;; esac
           TRITON_RUST_READER_SPIN_US=${spin:-300} TRITON_RUST_READ_SHARES=${shares:-2} \
               tool "$name" served_reads_bench 600 "$name.txt" --gb 16 --instances 6 --parts 3 --batches 10 \
               --host-memory huge_pages --dir /tmp/served_reads_table &&
               grep -E "^\||^the store's reads" "$out/$name.txt" | sed "s/^/  /" ;;
    # no server: the host's steady plain gather (16 GB fp16 table in 2 MiB pages) alone, then with
    # the GPU's copies reading page-locked host memory beside it at 20 GB/s (as a served 10% cache's
    # 80 M missed rows a second go up) and as fast as the bus goes (bench/gpu/bus_load.py): whether
    # the host reads slower while the GPU's copies read its memory too
    plainbus) for load in 0 20 max; do
              if [ "$load" != 0 ]; then
                  g=$load; [ "$load" = max ] && g=0
                  python3 bench/gpu/bus_load.py --seconds 45 --gbps "$g" >> "$out/plainbus.load.txt" 2>&1 &
                  bus=$!; sleep 4
              fi
              tool "$name$load" served_reads_bench 200 "$name.$load.txt" --gb 16 --instances 6 --steady-only 1 \
                  --host-memory huge_pages --dir /tmp/served_reads_table &&
                  { echo "  bus load: $load"; grep -E "^\|" "$out/$name.$load.txt" | sed "s/^/  /"; }
              [ "$load" != 0 ] && { wait "$bus"; tail -1 "$out/plainbus.load.txt" | sed "s/^/  /"; }
          done ;;
    # no server: the bus alone, page-locked copies up and down (the served runs' dmon samples beside it)
    pcie) echo "== pcie"; timeout 60 python3 bench/gpu/pcie_bandwidth.py > "$out/pcie.txt" 2>&1 || rc=1
          sed "s/^/  /" "$out/pcie.txt" ;;
    # before the served runs: its 16 GB table leaves /dev/shm before their 52 GB come
    grid) tool grid miss_reads_bench 150 grid.txt --gb 16 --iters 3 --grid-only 1 --grid 4,8,16,32,0 &&
              grep "^|" "$out/grid.txt" | sed "s/^/  /"
          rm -rf /dev/shm/miss_reads ;;
    hbm) run hbm --cache 1.0 --stream-warm-passes 2 ;;
    # hbmN: every row in HBM on N instances, the reference the summary holds runs ending in N against
    hbm[0-9]*) run "$base" --cache 1.0 --stream-warm-passes 2 --instances "${base#hbm}" ;;
    mapped) run mapped --cache 0.1 --stream-warm-passes 20 --host-memory mapped ;;
    huge) run huge --cache 0.1 --stream-warm-passes 20 --host-memory huge_pages ;;
    huge12) run huge12 --cache 0.1 --stream-warm-passes 20 --host-memory huge_pages --instances 12 ;;
    gpu) run gpu --cache 0.1 --stream-warm-passes 20 --host-memory mapped --miss-reads gpu ;;
    both) run both --cache 0.1 --stream-warm-passes 20 --host-memory auto --miss-reads both ;;
    auto) run auto --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    parts2) run parts2 --cache 0.1 --stream-warm-passes 20 --host-memory auto --pipeline-parts 2 ;;
    auto8) run auto8 --cache 0.1 --stream-warm-passes 20 --host-memory auto --instances 8 ;;
    auto12) run auto12 --cache 0.1 --stream-warm-passes 20 --host-memory auto --instances 12 ;;
    # the store's worker pool (rayon, which the misses are read on) at 8, 12 or 32 threads
    # instead of one a core
    # nothing spinning while it waits: the network's caller and worker (TRITON_RUST_TORCH_SPIN),
    # the reader crew's idle members and callers (TRITON_RUST_READER_SPIN_US); `asleep` also
    # waits for the network's GPU work asleep (TRITON_RUST_GPU_WAIT=block), `asleep12` with 12 instances
    quiet) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quiet --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    asleep) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 TRITON_RUST_GPU_WAIT=block run asleep --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    asleep12) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 TRITON_RUST_GPU_WAIT=block run asleep12 --cache 0.1 --stream-warm-passes 20 --host-memory auto --instances 12 ;;
    # quiet with the misses read on N threads, the caller among them (TRITON_RUST_READERS; one
    # a core unless set): whether fewer readers leave the network's threads the cores they need
    quietr[0-9]*) TRITON_RUST_READERS=${base#quietr} TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 \
        run "$base" --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    # quiet with every CUDA wait in the process yielding its core, or asleep
    # (TRITON_RUST_CUDA_SCHED=yield|block; unset, CUDA spins)
    # (quietblockN: with N instances, as the cores the spinning waits held are free)
    quietyield|quietblock|quietblock[0-9]*) sched=${base#quiet}; sched=${sched%%[0-9]*}; n=${base#quiet"$sched"}
        TRITON_RUST_CUDA_SCHED=$sched TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 \
        run "$base" --cache 0.1 --stream-warm-passes 20 --host-memory auto ${n:+--instances "$n"} ;;
    # quiet with each key of the batch lookup read by N lanes instead of 8 (TRITON_RUST_LOOKUP_LANES,
    # 1, 2 or 4: 32, 16 or 8 keys' tags in flight a warp instead of 4)
    quietl[0-9]*) TRITON_RUST_LOOKUP_LANES=${base#quietl} TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 \
        run "$base" --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    # quiet with a cache of 99% of the rows: the probe path with almost no misses, which splits
    # the 10% cache's distance to hbm between the probe path and the misses
    quietc99) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietc99 --cache 0.99 --stream-warm-passes 20 --host-memory auto ;;
    # the same two under LRU: a hit's stamp a plain store of the epoch, not LFU's atomic add
    # (3.3 M a batch), so beside quietc99 in one call they say what the atomics take served
    quietlru) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietlru --cache 0.1 --stream-warm-passes 20 --host-memory auto --cache-policy lru ;;
    quietc99lru) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietc99lru --cache 0.99 --stream-warm-passes 20 --host-memory auto --cache-policy lru ;;
    # the pooled lookup's probe reading every key's set of tags (probe_slots), not the key index
    # (gpucache_key_index off, the default since 2026-12-01 00:30; the call of 00:05 ran quietc99
    # with the index, auto then); quietindex / quietc99index: every cache with a key index
    quietslots) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietslots --cache 0.1 --stream-warm-passes 20 --host-memory auto --cache-key-index off ;;
    quietindex) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietindex --cache 0.1 --stream-warm-passes 20 --host-memory auto --cache-key-index on ;;
    quietc99index) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietc99index --cache 0.99 --stream-warm-passes 20 --host-memory auto --cache-key-index on ;;
    # quietc99 with the probe's hits not stamped (gpucache_hit_stamp_every 0: what the stamps
    # cost); quietevery8 / quietc99every8: one hit in 8 stamped (the calls of 2026-12-01 00:21 and 00:25
    # ran them as quiet and quietc99, the rate then compiled in)
    quietc99nostamp) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietc99nostamp --cache 0.99 --stream-warm-passes 20 --host-memory auto --cache-hit-stamp-every 0 ;;
    # quiet (10% cached) with no hit stamped: what the stamps cost the 10% cache, its rate had
    # they cost nothing (LFU's counts then hold only misses: the hit rate is not the policy's)
    quietnostamp) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietnostamp --cache 0.1 --stream-warm-passes 20 --host-memory auto --cache-hit-stamp-every 0 ;;
    quietevery8) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietevery8 --cache 0.1 --stream-warm-passes 20 --host-memory auto --cache-hit-stamp-every 8 ;;
    quietc99every8) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietc99every8 --cache 0.99 --stream-warm-passes 20 --host-memory auto --cache-hit-stamp-every 8 ;;
    quietc99slots) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietc99slots --cache 0.99 --stream-warm-passes 20 --host-memory auto --cache-key-index off ;;
    # quiet with N shares a reader of a batch's misses (TRITON_RUST_READ_SHARES; 2 otherwise), or
    # the reader crew's members at niceness N (TRITON_RUST_READER_NICE): the instances' and the
    # network's threads run first when the cores are short
    quiets[0-9]*) TRITON_RUST_READ_SHARES=${base#quiets} TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 \
        run "$base" --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    quietnice[0-9]*) TRITON_RUST_READER_NICE=${base#quietnice} TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 \
        run "$base" --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    # hbm / quiet with the instances' networks one after another on the GPU, in the order they
    # launch (TRITON_RUST_NETWORK_FIFO=1), instead of all sharing it at once
    hbmfifo) TRITON_RUST_NETWORK_FIFO=1 run hbmfifo --cache 1.0 --stream-warm-passes 2 ;;
    quietfifo) TRITON_RUST_NETWORK_FIFO=1 TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 \
        run quietfifo --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    # quiet with 8 instances
    quiet8) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quiet8 --cache 0.1 --stream-warm-passes 20 --host-memory auto --instances 8 ;;
    quiet12) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quiet12 --cache 0.1 --stream-warm-passes 20 --host-memory auto --instances 12 ;;
    # quiet12 with 36 queries in flight instead of 24 (12 instances, three queries each)
    quiet12c36) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quiet12c36 --cache 0.1 --stream-warm-passes 20 --host-memory auto --instances 12 --stream-concurrency 36 ;;
    # quiet with every key's row written out and then pooled (the path before the lookup
    # pooled as it went, TRITON_RUST_POOL_FROM_SLOTS=0): the same call's before and after
    rowsquiet) TRITON_RUST_POOL_FROM_SLOTS=0 TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run rowsquiet --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    # quiet with each missed (table, key) of a batch read and filled once
    # (TRITON_RUST_MISSES_ONCE=1): the same call's before (quiet) and after
    quietonce) TRITON_RUST_MISSES_ONCE=1 TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietonce --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    # quiet with MLPerf's Server shape, queries of 270 pairs (issue 66: p99 <= 60 ms at >= 5 M
    # pairs/s), 256 in flight (about the pairs 24 queries of 8,192 keep in flight, a third)
    quiet270) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quiet270 --cache 0.1 --stream-warm-passes 20 --host-memory auto --stream-pairs 270 --stream-concurrency 256 ;;
    # quiet with each batch in two parts, one part's misses read while the network runs on the
    # other (recommender_pipeline_parts 2): whether a batch's reads hide behind its own network
    quietparts2) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietparts2 --cache 0.1 --stream-warm-passes 20 --host-memory auto --pipeline-parts 2 ;;
    # quiet with each batch's misses shared between host threads and the GPU reading its share in
    # place on a few SMs (gpucache_miss_reads both; TRITON_RUST_GPU_READ_BLOCKS blocks, 16 unless set)
    # (bothquietN: on N blocks a read kernel, N of them for the GPU's reads of each of 6 instances)
    bothquiet|bothquiet[0-9]*) blocks=${base#bothquiet}
        TRITON_RUST_GPU_READ_BLOCKS=${blocks:-16} TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 \
            run "$base" --cache 0.1 --stream-warm-passes 20 --host-memory auto --miss-reads both ;;
    # bothquiet with the GPU's reads yielding the SMs to the network (TRITON_RUST_GPU_READS_YIELD=1:
    # their stream at the least priority, the network's above) on a grid of short blocks, a warp
    # for every four misses (bothyieldN: on N blocks a read kernel)
    bothyield|bothyield[0-9]*) blocks=${base#bothyield}
        TRITON_RUST_GPU_READS_YIELD=1 TRITON_RUST_GPU_READ_BLOCKS=${blocks:-0} TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 \
            run "$base" --cache 0.1 --stream-warm-passes 20 --host-memory auto --miss-reads both ;;
    # every row in HBM with nothing spinning: whether quiet costs the model inside the GPU
    # hbm / quiet with batches of up to 32,768 pairs (four queries) and 48 queries in flight
    hbmb32) run hbmb32 --cache 1.0 --stream-warm-passes 2 --max-batch 32768 --graph-batches 8192,16384,24576,32768 \
        --stream-concurrency 48 ;;
    quietb32) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run quietb32 --cache 0.1 --stream-warm-passes 20 \
        --host-memory auto --max-batch 32768 --graph-batches 8192,16384,24576,32768 --stream-concurrency 48 ;;
    hbmquiet) TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run hbmquiet --cache 1.0 --stream-warm-passes 2 ;;
    pool8|pool12|pool32) RAYON_NUM_THREADS=${base#pool} run "$base" --cache 0.1 --stream-warm-passes 20 --host-memory auto ;;
    # a warm restart: a server that saves its caches' keys every 15 s, stopped; a new one loads
    # them at start and its first 30 s are measured (one warm pass, then 30 s or more); `cold` the same
    # new server with no saved keys
    saved) rm -rf /dev/shm/cache_state
           run saved --cache 0.1 --stream-warm-passes 20 --host-memory auto --cache-state-dir /dev/shm/cache_state ;;
    # (the stream's length is set from the warm pass's rate, about 0.65x the steady one after a
    # restart: 50 s at that rate is over 30 s at the steady rate, the window issue 66 asks)
    restart) run restart --cache 0.1 --stream-warm-passes 1 --stream-seconds 50 --host-memory auto --cache-state-dir /dev/shm/cache_state
             grep -h "warmed its caches\|cache state\|saved the" /tmp/dlrm_v2/server.log | cut -c1-220 >> "$out/restart.log" ;;
    # pinned caches (gpucache_policy pinned): quietsaved is quiet saving what its LFU caches hold
    # (every 15 s and at unload); quietpin then holds those keys from load to unload, no hit
    # stamped, no miss taken in (its warm passes only start the stream)
    # (quietsavedcP: the same with P% of the rows cached, for the pinned runs named ...cP)
    quietsaved|quietsavedc[0-9]*) rm -rf /dev/shm/cache_state
        pct=${base#quietsaved}; pct=${pct#c}; cache=$(awk "BEGIN { print ${pct:-10} / 100 }")
        TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0 run "$base" --cache "$cache" --stream-warm-passes 20 \
            --host-memory auto --cache-state-dir /dev/shm/cache_state ;;
    # (quietpinN: N instances; quietpinindex: a key index; quietpinboth: the GPU reading a share
    # of the misses in place beside the host's readers; quietpin270: 270-pair queries, 256 in
    # flight; quietpinb32: batches of up to 32,768 pairs, 48 queries in flight; quietpinlastN:
    # with a key index, a batch's last part of misses N rows (TRITON_RUST_LAST_PART; 0: the
    # parts of at least 65,536 before 2026-12-02, three a batch here); quietpinrN: with a key
    # index, the misses read on N threads, the callers among them (TRITON_RUST_READERS; one a
    # core unless set): whether a crew that leaves the instances' threads their cores reads more;
    # quietpinidle, quietpinidleN...: with a key index, the crew's members in SCHED_IDLE
    # (TRITON_RUST_READER_NICE=idle: any other thread that wakes takes a reader's core at once;
    # the default from 2026-12-02); quietpinasis...: the members at the callers' priority
    # (TRITON_RUST_READER_NICE=0, the rule before); quietpinsharesN: with a key index, N shares a
    # reader (TRITON_RUST_READ_SHARES; 2 unless set): whether smaller shares shorten the reads when a
    # member in SCHED_IDLE is taken off its core holding one; quietpinindexN: quietpinindex with N
    # instances (more batches in flight to fill the host's idle moments);
    # pindefaultsN: quietpinindexN with the server's defaults: what a user gets without the two
    # knobs, against quietpinindexN in the same call (since 2026-12-02 the defaults sleep where
    # quiet sets them to: the network's hand-over asleep when host threads read the misses,
    # the reader crew watching for nothing); pinspinN: quietpinindexN with the defaults before
    # that, spinning (TRITON_RUST_TORCH_SPIN=both, TRITON_RUST_READER_SPIN_US=300);
    # quietpinyieldN / quietpinblockN: quietpinindexN with every CUDA wait yielding its core or
    # asleep (TRITON_RUST_CUDA_SCHED): whether the readers in SCHED_IDLE get the cores the
    # instances' spinning waits for the GPU held (8 instances: torch-gpu 2.7 cores, 2026-12-02)
    # quietpinbothN: quietpinindexN with the GPU reading a share of the misses in place beside the
    # host's readers (the host's cores are what the reads lack; the GPU is idle 36-53% at 8 instances);
    # quietpinpollN: quietpinindexN with the network's wait asking its event every 20 us, asleep
    # between (TRITON_RUST_GPU_WAIT=poll): those cores for the readers, the lookups' waits spinning
    # (pinsplitN and its kin, the crew on CPUs of its own, ran at commit 8dea119: 0.79-0.90x
    # pindefaultsN in every form, taken out)
    # any pinned run with cP after its name (pindefaults8c5): P% of the rows cached, pinned to the
    # keys quietsavedcP saved: the misses a pair grow as the cache shrinks, so the store's miss
    # reads, served, are what bounds the rate rather than the model's (issue 66's first target)
    quietpin*|pindefaults[0-9]*|pinspin[0-9]*) keys=$(ls /dev/shm/cache_state/*.gpu0.cache_keys 2>/dev/null | head -1)
        cache=0.1 pct=""
        case "$base" in *c[0-9]|*c[0-9][0-9]) pct=${base##*c}; cache=$(awk "BEGIN { print $pct / 100 }"); base=${base%c*} ;; esac
        more=(); quiet=(TRITON_RUST_TORCH_SPIN=none TRITON_RUST_READER_SPIN_US=0)
        unset TRITON_RUST_LAST_PART TRITON_RUST_READERS TRITON_RUST_READER_NICE TRITON_RUST_READ_SHARES TRITON_RUST_CUDA_SCHED TRITON_RUST_GPU_WAIT
        case "$base" in
        quietpinidle*) more=(--cache-key-index on); export TRITON_RUST_READER_NICE=idle ;;
        quietpinasis*) more=(--cache-key-index on); export TRITON_RUST_READER_NICE=0 ;;
        quietpinshares[0-9]*) more=(--cache-key-index on); export TRITON_RUST_READ_SHARES=${base#quietpinshares} ;;
        quietpinyield[0-9]*) more=(--cache-key-index on --instances "${base#quietpinyield}"); export TRITON_RUST_CUDA_SCHED=yield ;;
        quietpinblock[0-9]*) more=(--cache-key-index on --instances "${base#quietpinblock}"); export TRITON_RUST_CUDA_SCHED=block ;;
        quietpinpoll[0-9]*) more=(--cache-key-index on --instances "${base#quietpinpoll}"); export TRITON_RUST_GPU_WAIT=poll ;;
        quietpinlast[0-9]*) more=(--cache-key-index on); export TRITON_RUST_LAST_PART=${base#quietpinlast} ;;
        quietpinr[0-9]*) more=(--cache-key-index on); export TRITON_RUST_READERS=${base#quietpinr} ;;
        quietpin270) more=(--stream-pairs 270 --stream-concurrency 256) ;;
        quietpinindex) more=(--cache-key-index on) ;;
        quietpinindex[0-9]*) more=(--cache-key-index on --instances "${base#quietpinindex}") ;;
        quietpinboth) more=(--miss-reads both) ;;
        quietpinboth[0-9]*) more=(--miss-reads both --cache-key-index on --instances "${base#quietpinboth}") ;;
        quietpinb32) more=(--max-batch 32768 --graph-batches 8192,16384,24576,32768 --stream-concurrency 48) ;;
        quietpin[0-9]*) more=(--instances "${base#quietpin}") ;;
        pindefaults[0-9]*) more=(--cache-key-index on --instances "${base#pindefaults}"); quiet=() ;;
        pinspin[0-9]*) more=(--cache-key-index on --instances "${base#pinspin}")
            quiet=(TRITON_RUST_TORCH_SPIN=both TRITON_RUST_READER_SPIN_US=300) ;;
        quietpin) ;;
        *) echo "unknown run: $name" >&2; rc=1; base="" ;;
        esac
        if [ -z "$base" ]; then :; elif [ -z "$keys" ]; then echo "$base: no saved keys (run quietsaved first)" >&2; rc=1; else
        [ ${#quiet[@]} -gt 0 ] && export "${quiet[@]}"
        [ -n "$pct" ] && base="${base}c$pct"
        run "$base" --cache "$cache" --stream-warm-passes 4 \
            --host-memory auto --cache-policy pinned --cache-pinned-keys "$keys" "${more[@]}"
        unset TRITON_RUST_TORCH_SPIN TRITON_RUST_READER_SPIN_US
        grep -h "gpucache_pinned_keys" /tmp/dlrm_v2/server.log | cut -c1-220 >> "$out/$base.log"; fi
        unset TRITON_RUST_LAST_PART TRITON_RUST_READERS TRITON_RUST_READER_NICE TRITON_RUST_READ_SHARES TRITON_RUST_CUDA_SCHED TRITON_RUST_GPU_WAIT ;;
    cold) run cold --cache 0.1 --stream-warm-passes 1 --stream-seconds 30 --host-memory auto ;;
    *) echo "unknown run: $name" >&2; rc=1 ;;
    esac
    [ "$extra" = trace ] && trace_off "$name"
done
python3 bench/gpu/cache_runs_summary.py "$out" | tee "$final/summary.txt"
tar czf "$final/runs.tgz" -C "$out" . && rm -rf "$out"
exit "$rc"
