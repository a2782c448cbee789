#!/usr/bin/env bash
# One call on the GPU machine for issue 7 (behaviour unchanged after the crate split):
# both GPU scripts, then the RSS of a GPU-only BERT-large with the previous build's
# library (.carry/before/libtriton_rust.so, if carried) and this one. Expects $PYT and
# .carry/ (bench/gpu/pack.sh). Output: stdout, and $OUT/*.log when $OUT is set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out="${OUT:-/tmp/out}"; mkdir -p "$out"
bash bench/gpu/run_embedding.sh 2>&1 | tee "$out/embedding_store.log"
bash bench/gpu/run_all_models.sh "$@" 2>&1 | tee "$out/all_models.log"
if [ -f .carry/before/libtriton_rust.so ]; then
    mkdir -p /tmp/before_backends/rust
    cp .carry/before/libtriton_rust.so .carry/libtriton_rust_torch.so .carry/libtriton_rust_torch_cuda.so /tmp/before_backends/rust/
    export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
    python3 bench/gpu/probe_rss.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --repo /tmp/all_models/repo \
        --model bert_large_fp32 --backends before=/tmp/before_backends after=/tmp/rust_backends 2>&1 | tee "$out/probe_rss.log"
fi
