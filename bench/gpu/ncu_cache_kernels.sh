#!/usr/bin/env bash
# The GPU cache's batch kernels under Nsight Compute on the GPU machine (its /usr/local/cuda/bin/ncu):
# registers a thread, occupancy, memory throughput and duration of the probe, pooling, close,
# lookup and fill kernels, as pool_slots_check drives them at DLRM-v2's shape (a small scale:
# the kernels see the same batches; ncu replays each one it profiles). After bash bench/gpu/pack.sh,
# carry [".carry"]:
#
#   bash bench/gpu/ncu_cache_kernels.sh [--scale 0.05]      # writes $OUT/ncu.txt, prints the lines that matter
set -u
cd "$(dirname "$0")/../.."
scale="${2:-0.05}"
[ "${1:-}" = "--scale" ] || scale=0.05
out="${OUT:-/tmp/out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 /usr/local/cuda/bin/ncu --kernel-name regex:"probe_slots|pool_probe|pool_close|batch_lookup|batch_fill_s16|pool_resident" \
    --launch-skip 80 --launch-count 6 --section LaunchStats --section Occupancy --section SpeedOfLight \
    --metrics l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,dram__bytes_read.sum,smsp__inst_executed.sum \
    .carry/pool_slots_check --scale "$scale" --iters 2 > "$out/ncu.txt" 2>&1
echo "ncu rc $?"
grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|local_op|dram__bytes|Memory Throughput|inst_executed" "$out/ncu.txt"
