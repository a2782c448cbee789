#!/usr/bin/env bash
# Runs every test: the Rust unit tests, then the integration tests that start the real
# tritonserver with libtriton_rust.so (pytest, tests/server/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
source scripts/env.sh
bash scripts/build.sh
echo "[test] architecture rules (unsafe only in FFI/CUDA crates, no engine on Triton, no cycle)"
python scripts/check_architecture.py
echo "[test] cargo test"
cargo test --release
if [ -n "$LIBTORCH_DIR" ]; then  # the torch plugin's own tests (its worker threads) need libtorch
    LD_LIBRARY_PATH="$LIBTORCH_DIR:$LD_LIBRARY_PATH" LIBTORCH="$(dirname "$LIBTORCH_DIR")" cargo test --release -p triton_rust_torch
fi
echo "[test] exporting test models"
python examples/export_models.py --repo models --models resnet50,bert_small,identity
python examples/torch_models.py --repo models --models fastpitch,resnet50_pt,bert_small_pt
python examples/recommenders.py --repo models --rows 1000
echo "[test] integration tests against the real tritonserver"
python -m pytest tests/server tests/tools -v "$@"
