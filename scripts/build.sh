#!/usr/bin/env bash
# Builds libtriton_rust.so (release) and installs it to install/backends/rust/ via cmake,
# the same way Triton's own backends are built and installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cmake -B build -S . >/dev/null
cmake --build build --target install
