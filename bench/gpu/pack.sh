#!/usr/bin/env bash
# Builds what the GPU machine needs into .carry/ (git-ignored, named in the device call's carry):
# the backend library and the GPU cache check, stripped so they travel small.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cargo build --release --lib --example gpu_cache_check
mkdir -p .carry
strip -o .carry/libtriton_rust.so target/release/libtriton_rust.so
strip -o .carry/gpu_cache_check target/release/examples/gpu_cache_check
ls -la .carry
