#!/usr/bin/env bash
# Runs every test: the Rust unit tests, then the integration tests that start the real
# tritonserver with libtriton_rust.so (pytest, tests/server/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# A run from a fresh clone takes about 12 GB of disk (.venv 5.4, models/ 3.6, target/ 1.9, the
# rest in /tmp; README); a full disk shows up late and strangely, so say up front what is free.
echo "[test] disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free where the checkout is"
bash scripts/setup.sh
source scripts/env.sh
# Inductor's compile cache for every export and test of this run, in memory where /dev/shm has
# 2 GiB to spare (no disk for it; export_models.sh keeps a cache its caller chose), gone at exit;
# and a folder there for a model file too large for the checkout's disk (BERT-large's two are
# 1.3 GB each; examples/model_files.py writes one there and links it only when the disk lacks
# room and the memory has it), gone at exit too: the next export writes such a file again.
cleanup=()
trap 'rm -rf "${cleanup[@]}"' EXIT
shm_free_kb="$(df -k --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')"
if [ -z "${TORCHINDUCTOR_CACHE_DIR:-}" ] && [ "${shm_free_kb:-0}" -gt $((2 << 20)) ] 2>/dev/null; then
    TORCHINDUCTOR_CACHE_DIR="$(mktemp -d -p /dev/shm inductor-cache.XXXXXX)"
    export TORCHINDUCTOR_CACHE_DIR
    cleanup+=("$TORCHINDUCTOR_CACHE_DIR")
fi
if [ -z "${TRITON_RUST_MODEL_SPILL:-}" ] && [ "${shm_free_kb:-0}" -gt $((6 << 20)) ] 2>/dev/null; then
    TRITON_RUST_MODEL_SPILL="$(mktemp -d -p /dev/shm model-spill.XXXXXX)"
    export TRITON_RUST_MODEL_SPILL
    cleanup+=("$TRITON_RUST_MODEL_SPILL")
fi
bash scripts/build.sh
echo "[test] architecture rules (unsafe only in FFI/CUDA crates, no engine on Triton, no cycle)"
python scripts/check_architecture.py
echo "[test] formatting (rustfmt.toml) and lints (clippy, warnings are errors)"
cargo fmt --all --check
cargo clippy --release --all-targets -- -D warnings
if [ -n "$LIBTORCH_DIR" ]; then
    LIBTORCH="$(dirname "$LIBTORCH_DIR")" cargo clippy --release --all-targets -p triton_rust_torch -p triton_rust_aoti -- -D warnings
fi
echo "[test] cargo test"
cargo test --release
if [ -n "$LIBTORCH_DIR" ]; then  # the torch plugin's own tests (its worker threads) need libtorch
    LD_LIBRARY_PATH="$LIBTORCH_DIR:$LD_LIBRARY_PATH" LIBTORCH="$(dirname "$LIBTORCH_DIR")" cargo test --release -p triton_rust_torch
fi
# the test and example programs cargo built are not run again here: their ~1 GB of disk goes back
# before the models are written (a test that needs an example links it again)
find target/release/deps target/release/examples -maxdepth 1 -type f -executable ! -name '*.so' -delete
echo "[test] disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free before the models are written"
echo "[test] exporting the example models (README \"Using it\" serves them all)"
bash scripts/export_models.sh
echo "[test] integration tests against the real tritonserver"
python -m pytest tests/server tests/tools -v "$@"
