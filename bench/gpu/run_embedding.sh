#!/usr/bin/env bash
# Runs the embedding-store GPU checks on a machine with an NVIDIA GPU. Expects:
#   $PYT    the unpacked nvidia-pytriton wheel (pytriton/tritonserver/bin/tritonserver inside)
#   .carry/ libtriton_rust.so and gpu_cache_check built on the CPU machine (bench/gpu/pack.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
mkdir -p /tmp/rust_backends/rust
cp .carry/libtriton_rust.so /tmp/rust_backends/rust/
echo "== GPU cache: policy equivalence with the CPU cache, and the hit path"
.carry/gpu_cache_check "$@"
echo "== the store on a GPU instance of tritonserver"
python3 bench/gpu/embedding_store.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --backends /tmp/rust_backends
