#!/usr/bin/env bash
# Issue 10 on the GPU machine, one part per device call (each under 10 minutes):
#   reload torch|onnx|embedding [cycles] [args]  200 load/infer/unload cycles on KIND_GPU (reload_cycles.py)
#   soak                                    8 minutes, 256 clients (soak.py; run run_all_models.sh first)
#   faults                                  too large, out-of-range ids, device-side assert (gpu_faults.py)
# Expects $PYT, .carry/ (pack.sh) and, for onnx, /tmp/ort (unpack_ort_gpu.sh). Logs go to $OUT too.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out="${OUT:-/tmp/out}"; mkdir -p "$out"
TORCH_DIR=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
SITE=$(dirname "$TORCH_DIR")
# CUDA 13 libraries of the machine's torch (cuBLAS, cuDNN), which onnxruntime-gpu also needs
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:$TORCH_DIR/lib:$SITE/nvidia/cu13/lib:$SITE/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /tmp/rust_backends/rust
cp .carry/libtriton_rust.so .carry/libtriton_rust_torch.so .carry/libtriton_rust_torch_cuda.so /tmp/rust_backends/rust/
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
