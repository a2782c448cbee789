#!/usr/bin/env bash
# On the GPU machine: gathers a part of .carry_ort (carried by this call) into
# /tmp/ort_parts and, once every part is there, unpacks ONNX Runtime into /tmp/ort.
#   bash bench/gpu/unpack_ort_gpu.sh <number of parts>
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p /tmp/ort_parts /tmp/ort
cp .carry_ort/ort.tar.zst.part-* /tmp/ort_parts/ 2>/dev/null || true
[ -d .carry_ort/tools ] && cp .carry_ort/tools/* /tmp/ort_parts/
have=$(ls /tmp/ort_parts/ort.tar.zst.part-* | wc -l)
echo "parts here: $have of $1"
if [ "$have" -ge "$1" ] && [ ! -f /tmp/ort/libonnxruntime.so.1.31.1 ]; then
    cat /tmp/ort_parts/ort.tar.zst.part-* | LD_LIBRARY_PATH=/tmp/ort_parts /tmp/ort_parts/zstd -d --long=27 -q -c | tar -C /tmp/ort -xf -
    ls -la /tmp/ort
fi
