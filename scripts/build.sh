#!/usr/bin/env bash
# Builds libtriton_rust.so (release) and installs it to install/backends/rust/ via cmake,
# the same way Triton's own backends are built and installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
# The torch plugin builds against the torch wheel installed by setup.sh (libtorch 2.11.0).
if [ -z "${LIBTORCH:-}" ]; then
    for d in .venv/lib/python3*/site-packages/torch; do
        if [ -f "$d/lib/libtorch_cpu.so" ]; then export LIBTORCH="$PWD/$d"; fi
    done
fi
if [ -n "${LIBTORCH:-}" ]; then torch=ON; else torch=OFF; fi
cmake -B build -S . -DTRITON_RUST_ENABLE_TORCH=$torch >/dev/null
cmake --build build --target install
