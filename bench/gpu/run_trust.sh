#!/usr/bin/env bash
# Issue 10 on the GPU machine, one part per device call (each under 10 minutes):
#   reload torch|onnx|embedding [cycles] [args]  200 load/infer/unload cycles on KIND_GPU (reload_cycles.py)
#   soak                                    8 minutes, 256 clients (soak.py; run run_all_models.sh first)
#   faults                                  too large, out-of-range ids, device-side assert (gpu_faults.py)
# Expects $PYT, .carry/ (pack.sh) and, for onnx, /tmp/ort (unpack_ort_gpu.sh). Logs go to $OUT too.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. bench/gpu/gpu_env.sh
server="$PYT/pytriton/tritonserver/bin/tritonserver"
case "${1:-}" in
reload)
    python3 bench/gpu/reload_cycles.py --server "$server" --backends /tmp/rust_backends --kind "$2" \
        --cycles "${3:-200}" "${@:4}" --ort-lib /tmp/ort/libonnxruntime.so.1.31.1 2>&1 | tee "$out/reload_$2.log" ;;
soak)
    python3 bench/gpu/soak.py --server "$server" --backends /tmp/rust_backends 2>&1 | tee "$out/soak.log" ;;
faults)
    python3 bench/gpu/gpu_faults.py --server "$server" --backends /tmp/rust_backends 2>&1 | tee "$out/gpu_faults.log" ;;
*) echo "usage: $0 reload torch|onnx|embedding [cycles] | soak | faults" >&2; exit 2 ;;
esac
