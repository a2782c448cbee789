#!/usr/bin/env bash
# On the GPU machine: unpack the nvidia-pytriton wheel (the real tritonserver) carried in
# .deps/wheels/ (scripts/setup.sh downloads it) to ${PYT:-/tmp/pyt}, for the run_*.sh scripts.
# The wheel is 55 MB, so it travels alone in its device call (carry: [".deps/wheels"]).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dest="${PYT:-/tmp/pyt}"
if [ ! -x "$dest/pytriton/tritonserver/bin/tritonserver" ]; then
    mkdir -p "$dest"
    python3 -m zipfile -e .deps/wheels/nvidia_pytriton-*.whl "$dest"
    chmod +x "$dest/pytriton/tritonserver/bin/tritonserver"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ls -la "$dest/pytriton/tritonserver/bin/tritonserver"
