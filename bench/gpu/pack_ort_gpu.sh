#!/usr/bin/env bash
# Prepares ONNX Runtime with the CUDA provider for the GPU machine (which has only a
# CPU onnxruntime): onnxruntime-gpu 1.31.1 from PyPI (built for CUDA 13), its three
# libraries tarred, zstd-compressed and split into parts that fit one device call each,
# plus the zstd binary and library to unpack them there. Output: .carry_ort/
#   on the GPU machine:  bash bench/gpu/unpack_ort_gpu.sh   (after every part is in /tmp/ort_parts)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
command -v zstd >/dev/null || { apt-get update -qq && apt-get install -y -qq zstd; }
out=.carry_ort; work=/tmp/ort_gpu_pack
mkdir -p "$out" "$work"
whl="$work/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
[ -f "$whl" ] || .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 onnxruntime-gpu==1.31.1 -d "$work"
rm -rf "$work/lib" && mkdir -p "$work/lib"
.venv/bin/python - "$whl" "$work/lib" <<'PY'
import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for n in ("libonnxruntime.so.1.31.1", "libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so"):
    with open(os.path.join(sys.argv[2], n), "wb") as f:
        f.write(z.read("onnxruntime/capi/" + n))
PY
rm -f "$out"/ort.tar.zst.part-*
tar -C "$work/lib" -cf - . | zstd -12 --long=27 -T2 -q -c | split -b 32M - "$out/ort.tar.zst.part-"
mkdir -p "$out/tools"
cp /usr/bin/zstd "$out/tools/"
cp "$(ldconfig -p | awk '/libzstd.so.1 /{print $NF; exit}')" "$out/tools/libzstd.so.1"
ls -la "$out" "$out/tools"
