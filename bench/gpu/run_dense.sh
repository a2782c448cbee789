#!/usr/bin/env bash
# Issue 9 on the GPU machine: dense models with and without CUDA graphs against the bare
# engine, measured by perf_analyzer (bench/gpu/dense_perf.py). Expects $PYT (the unpacked
# nvidia-pytriton wheel), .carry/ (pack.sh) and .carry_pa/ (the perf-analyzer 2.60.0 wheel,
# see the README, "On an NVIDIA GPU"). Extra arguments go to dense_perf.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out="${OUT:-/tmp/out}"; mkdir -p "$out"
TORCH_DIR=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
SITE=$(dirname "$TORCH_DIR")
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:$TORCH_DIR/lib:$SITE/nvidia/cu13/lib:$SITE/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
if [ ! -x /tmp/pa/perf_analyzer/bin/perf_analyzer ]; then
    pip install --quiet --no-index --no-deps --target /tmp/pa .carry_pa/perf_analyzer-*.whl
fi
mkdir -p /tmp/rust_backends/rust
cp .carry/libtriton_rust.so .carry/libtriton_rust_torch.so .carry/libtriton_rust_torch_cuda.so /tmp/rust_backends/rust/
set +e
python3 bench/gpu/dense_perf.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --backends /tmp/rust_backends \
    --perf-analyzer /tmp/pa/perf_analyzer/bin/perf_analyzer "$@" 2>&1 | tee "$out/dense_perf.log"
rc=${PIPESTATUS[0]}
# one archive: a device call brings back only a few files
tar -C "$out" -czf "$out/perf.tgz" perf && rm -rf "$out/perf"
exit "$rc"
