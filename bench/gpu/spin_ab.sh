#!/usr/bin/env bash
# On the GPU machine: ResNet50 FP16 at batch 1 (eager and CUDA graphs, concurrency 1) served
# three times, one server per setting of the torch worker's spinning
# (TRITON_RUST_TORCH_SPIN = none, both, answer; crates/torch/src/worker.rs), in one call so
# that the settings meet the same GPU and host. Expects what run_dense.sh expects.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. bench/gpu/gpu_env.sh
if [ ! -x /tmp/pa/perf_analyzer/bin/perf_analyzer ]; then
    pip install --quiet --no-index --no-deps --target /tmp/pa .carry_pa/perf_analyzer-*.whl
fi
for spin in none both answer; do
    echo "== TRITON_RUST_TORCH_SPIN=$spin"
    TRITON_RUST_TORCH_SPIN=$spin OUT="$out/spin_$spin" timeout 240 python3 bench/gpu/dense_perf.py \
        --server "$PYT/pytriton/tritonserver/bin/tritonserver" --backends /tmp/rust_backends \
        --perf-analyzer /tmp/pa/perf_analyzer/bin/perf_analyzer --work /tmp/spin_ab --only resnet50 --batches 1 --no-online "$@" 2>&1 \
        | grep -v "CUDA graph captured" || true
done | tee "$out/spin_ab.log"
tar -C "$out" -czf "$out/spin_ab.tgz" spin_none spin_both spin_answer
