#!/usr/bin/env bash
# Issue 7 on the GPU machine (behaviour unchanged after the crate split), in two parts
# that each fit one device call:
#   models     all six models vs torch eager (run_all_models.sh), then the RSS of a
#              GPU-only BERT-large served by the previous build's library
#              (.carry/before/libtriton_rust.so, if carried) and by this one
#   recommenders-before  the recommender ensembles with the previous build's library
#   embedding  the GPU cache check and the store on a GPU instance (run_embedding.sh)
# Expects $PYT and .carry/ (bench/gpu/pack.sh). Logs also go to $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
part="${1:-models}"; shift || true
out="${OUT:-/tmp/out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
case "$part" in
models)
    bash bench/gpu/run_all_models.sh "$@" 2>&1 | tee "$out/all_models.log"
    if [ -f .carry/before/libtriton_rust.so ]; then
        mkdir -p /tmp/before_backends/rust
        cp .carry/before/libtriton_rust.so .carry/libtriton_rust_torch.so .carry/libtriton_rust_torch_cuda.so /tmp/before_backends/rust/
        python3 bench/gpu/probe_rss.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --repo /tmp/all_models/repo \
            --model bert_large_fp32 --backends before=/tmp/before_backends after=/tmp/rust_backends 2>&1 | tee "$out/probe_rss.log"
    fi
    ;;
recommenders-before)
    # the recommender ensembles (and their concurrent checks) with the previous build
    mkdir -p /tmp/before_backends/rust
    cp .carry/before/libtriton_rust.so .carry/libtriton_rust_torch.so .carry/libtriton_rust_torch_cuda.so /tmp/before_backends/rust/
    python3 bench/gpu/all_models.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --backends /tmp/before_backends \
        --work /tmp/all_models_before --only dlrm,dcnv2,wide_deep "$@" 2>&1 | tee "$out/recommenders_before.log"
    ;;
embedding)
    bash bench/gpu/run_embedding.sh "$@" 2>&1 | tee "$out/embedding_store.log"
    if [ -f .carry/before/libtriton_rust.so ]; then
        echo "== the same, with the previous build's library"
        mkdir -p /tmp/before_backends/rust
        cp .carry/before/libtriton_rust.so /tmp/before_backends/rust/
        python3 bench/gpu/embedding_store.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --backends /tmp/before_backends 2>&1 | tee "$out/embedding_store_before.log"
    fi
    if [ -f .carry/before/libtriton_rust.so ] && [ -d /tmp/all_models/repo/bert_large_fp32 ]; then
        # the models part left its repository on this (still warm) machine: measure again
        mkdir -p /tmp/before_backends/rust
        cp .carry/before/libtriton_rust.so .carry/libtriton_rust_torch.so .carry/libtriton_rust_torch_cuda.so /tmp/before_backends/rust/
        python3 bench/gpu/probe_rss.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --repo /tmp/all_models/repo \
            --model bert_large_fp32 --backends before=/tmp/before_backends after=/tmp/rust_backends 2>&1 | tee "$out/probe_rss.log"
    fi
    ;;
*) echo "usage: $0 models|embedding [args]" >&2; exit 2 ;;
esac
