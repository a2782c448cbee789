#!/usr/bin/env bash
# The GPU caches' key index (gpucache_key_index) on the GPU alone, in one call: pool_slots_check
# (DLRM-v2's shape at --scale, LFU caches of fp16 rows) with each cache's key index, whose slots
# path then probes through it (probe_index), and without (probe_slots, every key's set's tags):
# the pooled sums against the host's and against the rows path, the probe's misses against
# batch_lookup's scan of the tags on the same keys, and each GPU step timed by events. After
# bash bench/gpu/pack.sh, carry [".carry"]:
#
#   bash bench/gpu/key_index_check.sh [--scale 0.25]    # $OUT/key-index/index<0|1>.txt, and the lines that matter
#
# --defer: instead, both without the key index, the hits' stamps deferred off the caches' queue
# (TRITON_RUST_DEFER_STAMPS=1, defer1.txt) and stamped by the probe (defer0.txt): the same checks,
# the same hit rates, and the lookup's time on the queue each way.
set -u
cd "$(dirname "$0")/../.."
scale=0.25
runs="index1 index0"
while [ $# -gt 0 ]; do
    case "$1" in
    --scale) scale="$2"; shift 2 ;;
    --defer) runs="defer1 defer0"; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
out="${OUT:-/tmp/out}/key-index"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
rc=0
for r in $runs; do
    f="$out/$r.txt"
    index=0; [ "$r" = index1 ] && index=1
    defer=0; [ "$r" = defer1 ] && defer=1
    echo "== TRITON_RUST_DEFER_STAMPS=$defer pool_slots_check --index $index --scale $scale" | tee "$f"
    TRITON_RUST_DEFER_STAMPS=$defer timeout 200 .carry/pool_slots_check --scale "$scale" --warm 30 --iters 8 \
        --index "$index" >> "$f" 2>&1 || { echo "pool_slots_check rc $?" | tee -a "$f"; rc=1; }
    grep -E "checked:|GPU steps|a batch,|panicked|error" "$f"
done
exit $rc
