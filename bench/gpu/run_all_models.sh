#!/usr/bin/env bash
# All six models on the GPU (bench/gpu/all_models.py). Expects $PYT (the unpacked
# nvidia-pytriton wheel) and .carry/ from bench/gpu/pack.sh; uses the machine's torch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
mkdir -p /tmp/rust_backends/rust
cp .carry/libtriton_rust.so .carry/libtriton_rust_torch.so .carry/libtriton_rust_torch_cuda.so /tmp/rust_backends/rust/
python3 bench/gpu/all_models.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --backends /tmp/rust_backends "$@"
