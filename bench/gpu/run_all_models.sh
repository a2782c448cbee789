#!/usr/bin/env bash
# All six models on the GPU (bench/gpu/all_models.py). Expects $PYT (the unpacked
# nvidia-pytriton wheel) and .carry/ from bench/gpu/pack.sh; uses the machine's torch.
# With onnxruntime-gpu unpacked in /tmp/ort (bench/gpu/unpack_ort_gpu.sh), the ONNX models
# of examples/ run on KIND_GPU too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. bench/gpu/gpu_env.sh
ort=()
if [ -f /tmp/ort/libonnxruntime.so.1.31.1 ]; then
    ort=(--ort-lib /tmp/ort/libonnxruntime.so.1.31.1)
fi
python3 bench/gpu/all_models.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --backends /tmp/rust_backends "${ort[@]}" "$@"
