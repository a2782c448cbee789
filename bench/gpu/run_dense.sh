#!/usr/bin/env bash
# Issue 9 on the GPU machine: dense models with and without CUDA graphs against the bare
# engine, measured by perf_analyzer (bench/gpu/dense_perf.py). Expects $PYT (the unpacked
# nvidia-pytriton wheel), .carry/ (pack.sh) and .carry_pa/ (the perf-analyzer 2.60.0 wheel,
# see the README, "On an NVIDIA GPU"). Extra arguments go to dense_perf.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. bench/gpu/gpu_env.sh
if [ ! -x /tmp/pa/perf_analyzer/bin/perf_analyzer ]; then
    pip install --quiet --no-index --no-deps --target /tmp/pa .carry_pa/perf_analyzer-*.whl
fi
# the ONNX models too when onnxruntime-gpu was unpacked (pack_ort_gpu.sh / unpack_ort_gpu.sh)
ort=()
if [ -f /tmp/ort/libonnxruntime.so.1.31.1 ]; then
    ort=(--ort-lib /tmp/ort/libonnxruntime.so.1.31.1 --ort-bare .carry/ort_bare)
fi
set +e
timeout "${DENSE_TIMEOUT:-3600}" python3 bench/gpu/dense_perf.py "${ort[@]}" --server "$PYT/pytriton/tritonserver/bin/tritonserver" --backends /tmp/rust_backends \
    --perf-analyzer /tmp/pa/perf_analyzer/bin/perf_analyzer "$@" 2>&1 | tee "$out/dense_perf.log"
rc=${PIPESTATUS[0]}
# one archive: a device call brings back only a few files
tar -C "$out" -czf "$out/perf.tgz" perf && rm -rf "$out/perf"
exit "$rc"
