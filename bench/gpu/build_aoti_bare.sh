#!/usr/bin/env bash
# Builds bench/gpu/aoti_bare.cpp (the bare AOTInductor reference) against a torch wheel's
# libtorch and the CUDA runtime beside it: bench/gpu/pack.sh runs it here (the carried binary),
# bench/gpu/run.sh on the GPU machine when none was carried.
#
#   bash bench/gpu/build_aoti_bare.sh TORCH_DIR OUTPUT     # TORCH_DIR: site-packages/torch
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
torch="${1:?TORCH_DIR (site-packages/torch)}"; out="${2:?output path}"
site="$(dirname "$torch")"
# CUDA's runtime headers: the toolkit's (which has every header they include), else the
# wheel's nvidia package plus the headers triton's wheel carries (crt/, nv/)
inc=()
for d in "${CUDA_HOME:-/usr/local/cuda}/include" "$site/nvidia/cu13/include" "$site/triton/backends/nvidia/include"; do
    [ -f "$d/cuda_runtime_api.h" ] && inc+=("-I$d")
done
[ "${#inc[@]}" -gt 0 ] || { echo "no CUDA runtime headers (CUDA_HOME or the torch wheel's nvidia/cu13)" >&2; exit 1; }
# the CUDA runtime torch itself loads (the wheel's), else the toolkit's
if ls "$site"/nvidia/cu13/lib/libcudart.so.* >/dev/null 2>&1; then
    rt_dir="$site/nvidia/cu13/lib"; rt="-l:$(basename "$(ls "$rt_dir"/libcudart.so.* | head -1)")"
else
    rt_dir="${CUDA_HOME:-/usr/local/cuda}/lib64"; rt="-lcudart"
fi
# torch's wheels are built with the C++11 ABI (as crates/aoti's build script assumes too)
g++ -O2 -std=c++20 -D_GLIBCXX_USE_CXX11_ABI=1 -DGLOG_USE_GLOG_EXPORT -Wno-deprecated-declarations \
    bench/gpu/aoti_bare.cpp -o "$out" \
    -I"$torch/include" -I"$torch/include/torch/csrc/api/include" "${inc[@]}" \
    -L"$torch/lib" -ltorch -ltorch_cpu -ltorch_cuda -lc10 -lc10_cuda -L"$rt_dir" "$rt" \
    -Wl,-rpath,"$torch/lib:$rt_dir"
echo "built $out against $torch"
