#!/usr/bin/env bash
# On the GPU machine: unpack the nvidia-pytriton wheel (the real tritonserver; scripts/setup.sh
# downloads it into .deps/wheels/) to ${PYT:-/tmp/pyt}, for the run_*.sh scripts. The wheel is
# 55 MB and a device call carries 64 MiB with the working tree, so it travels in two parts
# (bench/gpu/pack.sh splits it into .carry_pyt/), one per call:
#   bash bench/gpu/unpack_pytriton.sh 2     (carry: [".carry_pyt/part-aa"], then [".carry_pyt/part-ab"])
# Each call gathers its part into /tmp/pyt_parts; the call that brings the last one unpacks.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dest="${PYT:-/tmp/pyt}"
parts="${1:-2}"
if [ ! -x "$dest/pytriton/tritonserver/bin/tritonserver" ]; then
    mkdir -p /tmp/pyt_parts
    cp .carry_pyt/part-* /tmp/pyt_parts/ 2>/dev/null || true
    have=$(ls /tmp/pyt_parts/part-* 2>/dev/null | wc -l)
    echo "wheel parts here: $have of $parts"
    [ "$have" -ge "$parts" ] || exit 0
    cat /tmp/pyt_parts/part-* > /tmp/pyt_parts/pytriton.whl
    mkdir -p "$dest"
    python3 -m zipfile -e /tmp/pyt_parts/pytriton.whl "$dest"
    chmod +x "$dest/pytriton/tritonserver/bin/tritonserver"
    rm -rf /tmp/pyt_parts
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ls -la "$dest/pytriton/tritonserver/bin/tritonserver"
