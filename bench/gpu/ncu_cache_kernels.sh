#!/usr/bin/env bash
# The GPU cache's batch kernels under Nsight Compute on the GPU machine (its /usr/local/cuda/bin/ncu):
# registers a thread, occupancy, memory throughput and duration of the probe, pooling, close,
# lookup and fill kernels, as pool_slots_check drives them at DLRM-v2's shape (a small scale:
# the kernels see the same batches; ncu replays each one it profiles). After bash bench/gpu/pack.sh,
# carry [".carry"]:
#
#   bash bench/gpu/ncu_cache_kernels.sh [--scale 0.05] [--deep]     # writes $OUT/ncu.txt, prints the lines that matter
#
# --deep: only the probe and its pooling (probe_slots, pool_probe), once each, with where their
# warps stall (WarpStateStats, SchedulerStats), the pipes they use (ComputeWorkloadAnalysis), the
# memory they move (MemoryWorkloadAnalysis) and the source lines they stall on (SourceCounters).
set -u
cd "$(dirname "$0")/../.."
scale=0.05
deep=0
while [ $# -gt 0 ]; do
    case "$1" in
    --scale) scale="$2"; shift 2 ;;
    --deep) deep=1; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
out="${OUT:-/tmp/out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
kernels="probe_slots|pool_probe|pool_close|batch_lookup|batch_fill_s16|pool_resident"
sections=(--section LaunchStats --section Occupancy --section SpeedOfLight)
count=6
skip=80
if [ "$deep" = 1 ]; then
    kernels="probe_slots|pool_probe"
    sections+=(--section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis
               --section MemoryWorkloadAnalysis --section SourceCounters)
    count=2
    skip=40  # two kernels a batch, so past about 20 of the warm-up's batches
fi
timeout 200 /usr/local/cuda/bin/ncu --kernel-name regex:"$kernels" \
    --launch-skip "$skip" --launch-count "$count" "${sections[@]}" \
    --metrics l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,dram__bytes_read.sum,smsp__inst_executed.sum \
    .carry/pool_slots_check --scale "$scale" --iters 2 > "$out/ncu.txt" 2>&1
echo "ncu rc $?"
grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|local_op|dram__bytes|Memory Throughput|inst_executed" "$out/ncu.txt"
