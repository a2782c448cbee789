#!/usr/bin/env bash
# The miss path's checks and its speed beside the host's, in one device call (after
# `bash bench/gpu/pack.sh`, carry [".carry", ".carry_tools"]):
#
#   bash bench/gpu/miss_path.sh            # results in $OUT/miss-path/
#
# 1. `run.sh pooled-check`: pooled lookups on KIND_GPU through tritonserver exact against float64
#    sums of the stored rows, fp16 tables ten times their cache (their misses now go up as fp16),
#    the misses read by host threads and by the GPU in place;
# 2. `miss_reads_bench` on 16 and 8 host threads: a plain gather of a 16 GB fp16 table's rows
#    on the host alone, beside the store's reads of the same rows into a batch lookup (fp16 up,
#    fp32 up) and the GPU reading them in place, rows compared.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out="${OUT:-/tmp/out}/miss-path"
mkdir -p "$out"
rc=0
bash bench/gpu/run.sh --results "$out/pooled-check" pooled-check || rc=1
{
    echo "bash bench/gpu/miss_path.sh"
    date -u "+date (UTC): %Y-%m-%d %H:%M"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs"
    echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
    for t in 16 8; do
        echo "## miss_reads_bench --gb 16 --threads $t"
        timeout 280 .carry_tools/miss_reads_bench --gb 16 --threads "$t" --iters 5 || rc=1
    done
    rm -rf /dev/shm/miss_reads
} 2>&1 | tee "$out/miss_reads.log"
echo "miss_path.sh: exit $rc"
exit $rc
