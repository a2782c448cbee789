#!/usr/bin/env bash
# Builds libtriton_rust.so (release) and installs it to install/backends/rust/ via cmake,
# the same way Triton's own backends are built and installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
# The torch plugins build against the torch wheel installed by setup.sh (libtorch 2.11.0), or
# the libtorch LIBTORCH names: the AOTInductor plugin (libtriton_rust_aoti.so) builds against
# any; the TorchScript plugin (tch) needs 2.11, so with another libtorch set
# TRITON_RUST_TORCHSCRIPT=OFF (scripts/test_other_torch.sh does).
if [ -z "${LIBTORCH:-}" ]; then
    for d in .venv/lib/python3*/site-packages/torch; do
        if [ -f "$d/lib/libtorch_cpu.so" ]; then export LIBTORCH="$PWD/$d"; fi
    done
fi
if [ -n "${LIBTORCH:-}" ]; then torch=ON; else torch=OFF; fi
cmake -B build -S . -DTRITON_RUST_ENABLE_TORCH="${TRITON_RUST_TORCHSCRIPT:-$torch}" \
    -DTRITON_RUST_ENABLE_AOTI=$torch >/dev/null
cmake --build build --target install
