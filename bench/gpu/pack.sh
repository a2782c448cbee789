#!/usr/bin/env bash
# Builds what the GPU machine needs into .carry/ (git-ignored, named in the device call's carry):
# the backend library and the GPU cache check, stripped so they travel small.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cargo build --release --lib --example gpu_cache_check --example criteo_fixture --example host_read_bench --example batch_lookup_bench
if [ -z "${LIBTORCH:-}" ]; then
    for d in .venv/lib/python3*/site-packages/torch; do [ -f "$d/lib/libtorch_cpu.so" ] && export LIBTORCH="$PWD/$d"; done
fi
cargo build --release -p triton_rust_torch
cargo build --release -p triton_rust_engine_onnx --example ort_bare
mkdir -p .carry
strip -o .carry/libtriton_rust.so target/release/libtriton_rust.so
strip -o .carry/gpu_cache_check target/release/examples/gpu_cache_check
strip -o .carry/criteo_fixture target/release/examples/criteo_fixture
strip -o .carry/host_read_bench target/release/examples/host_read_bench
strip -o .carry/batch_lookup_bench target/release/examples/batch_lookup_bench
strip -o .carry/ort_bare target/release/examples/ort_bare
strip -o .carry/libtriton_rust_torch.so target/release/libtriton_rust_torch.so
strip -o .carry/libtriton_rust_torch_cuda.so target/release/libtriton_rust_torch_cuda.so
ls -la .carry
# the tritonserver wheel in two parts, one per device call (bench/gpu/unpack_pytriton.sh)
mkdir -p .carry_pyt && rm -f .carry_pyt/part-*
split -n 2 .deps/wheels/nvidia_pytriton-*.whl .carry_pyt/part-
ls -la .carry_pyt
