#!/usr/bin/env bash
# The batch lookup's lanes a key (TRITON_RUST_LOOKUP_LANES 8, 4, 2: a key's 32 tags read by 8, 4
# or 2 lanes, so 4, 8 or 16 keys a warp) on the GPU alone, in one call: for each, gpu_cache_check
# (the caches exact against the CPU's, and its hit path's lookups timed) and pool_slots_check
# (DLRM-v2's shape at --scale, the pooled sums against the host's, each GPU step timed by
# events). After bash bench/gpu/pack.sh, carry [".carry"]:
#
#   bash bench/gpu/lookup_lanes.sh [--lanes 8,4,2] [--scale 0.25]    # $OUT/lanes<N>.txt, and the lines that matter
set -u
cd "$(dirname "$0")/../.."
lanes=8,4,2
scale=0.25
while [ $# -gt 0 ]; do
    case "$1" in
    --lanes) lanes="$2"; shift 2 ;;
    --scale) scale="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
out="${OUT:-/tmp/out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
rc=0
for l in ${lanes//,/ }; do
    f="$out/lanes$l.txt"
    echo "== TRITON_RUST_LOOKUP_LANES=$l" | tee "$f"
    TRITON_RUST_LOOKUP_LANES=$l timeout 150 .carry/gpu_cache_check >> "$f" 2>&1 || { echo "gpu_cache_check rc $?" | tee -a "$f"; rc=1; }
    TRITON_RUST_LOOKUP_LANES=$l timeout 200 .carry/pool_slots_check --scale "$scale" --warm 30 --iters 8 >> "$f" 2>&1 \
        || { echo "pool_slots_check rc $?" | tee -a "$f"; rc=1; }
    grep -E "policy check|shared slots|hit path|checked:|GPU steps|a batch,|panicked|error" "$f"
done
exit $rc
