#!/usr/bin/env bash
# The GPU caches' key index (gpucache_key_index) on the GPU alone, in one call: pool_slots_check
# (DLRM-v2's shape at --scale, LFU caches of fp16 rows) with each cache's key index, whose slots
# path then probes through it (probe_index), and without (probe_slots, every key's set's tags):
# the pooled sums against the host's and against the rows path, the probe's misses against
# batch_lookup's scan of the tags on the same keys, and each GPU step timed by events. After
# bash bench/gpu/pack.sh, carry [".carry"]:
#
#   bash bench/gpu/key_index_check.sh [--scale 0.25]    # $OUT/key-index/index<0|1>.txt, and the lines that matter
set -u
cd "$(dirname "$0")/../.."
scale=0.25
while [ $# -gt 0 ]; do
    case "$1" in
    --scale) scale="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
out="${OUT:-/tmp/out}/key-index"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
rc=0
for index in 1 0; do
    f="$out/index$index.txt"
    echo "== pool_slots_check --index $index --scale $scale" | tee "$f"
    timeout 200 .carry/pool_slots_check --scale "$scale" --warm 30 --iters 8 --index "$index" >> "$f" 2>&1 \
        || { echo "pool_slots_check rc $?" | tee -a "$f"; rc=1; }
    grep -E "checked:|GPU steps|a batch,|panicked|error" "$f"
done
exit $rc
