#!/usr/bin/env bash
# Packs, on this (CPU) machine, everything the GPU machine needs for bench/gpu/run.sh, into
# folders that git ignores and that a device call names in its `carry`:
#
#   .carry/      (~37 MB) the stripped backend libraries (the AOTInductor plugin too), the tools
#                run.sh uses (gpu_cache_check, criteo_fixture, stream_client, pooled_lookup_bench,
#                libkernel_trace.so: every kernel's start and end in a served run,
#                pool_slots_check: the lookup that pools as it goes against the rows path,
#                ort_bare, aoti_bare: built against this venv's torch, the GPU machine's release)
#                and the real tritonserver (the nvidia-pytriton wheel's
#                server and libraries without the bundled libpython, xz-compressed: pyt.tar.xz).
#                Every subcommand needs it.
#   .carry_tools/ (~5 MB) the store's benchmarks a call runs directly, apart so that .carry,
#                .carry_pa and the working tree fit one call: batch_lookup_bench (a whole batch's
#                lookup timed alone: `timeout 300 .carry_tools/batch_lookup_bench`), miss_reads_bench
#                (misses read by host threads or by the GPU, alone: `.carry_tools/miss_reads_bench
#                --gb 16`; miss_path.sh), served_reads_bench (the served reads' shape on the host
#                alone: `.carry_tools/served_reads_bench --gb 16 --instances 6`).
#   .carry_pa/   (~7 MB) the perf-analyzer 2.60.0 wheel (needs glibc 2.38: runs there, not here).
#                `recommenders` and `dense` need it.
#   .carry_ort/  (only with --ort; ~194 MB in 32 MB parts) onnxruntime-gpu 1.31.1's libraries,
#                zstd-compressed, for the ONNX models on KIND_GPU. They cannot travel in one call
#                (64 MiB per call with the working tree): see run.sh's `ort` subcommand.
#
#   .carry_before/  (only with --before REV; ~7 MB) the backend and plugin libraries built from
#                commit REV (in a temporary worktree, target dir $CARGO_TARGET_DIR_BEFORE or
#                target/before), for bench/gpu/before_after.sh.
#
#   bash bench/gpu/pack.sh                # .carry/ and .carry_pa/
#   bash bench/gpu/pack.sh --ort          # and .carry_ort/
#   bash bench/gpu/pack.sh --before REV   # and .carry_before/
#
# Needs scripts/setup.sh's .deps/ (the pytriton wheel) and .venv (pip; torch for the torch
# engine's build). The device call then carries [".carry"] (plus ".carry_pa" where needed):
# bench/gpu/run.sh's header has the command lines.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
with_ort=0
[ "${1:-}" = "--ort" ] && with_ort=1
before=""
[ "${1:-}" = "--before" ] && before="${2:?--before needs a commit}"
py=.venv/bin/python

# the backend and the tools
cargo build --release --lib --example stream_client
cargo build --release -p triton_rust_embedding --features gpu --example gpu_cache_check --example criteo_fixture --example batch_lookup_bench --example pooled_lookup_bench --example pool_slots_check --example miss_reads_bench --example served_reads_bench
if [ -z "${LIBTORCH:-}" ]; then
    for d in .venv/lib/python3*/site-packages/torch; do [ -f "$d/lib/libtorch_cpu.so" ] && export LIBTORCH="$PWD/$d"; done
fi
cargo build --release -p triton_rust_torch
cargo build --release -p triton_rust_aoti
cargo build --release -p triton_rust_engine_onnx --example ort_bare
tgt="${CARGO_TARGET_DIR:-target}/release"
mkdir -p .carry .carry_tools
for f in libtriton_rust.so libtriton_rust_torch.so libtriton_rust_torch_cuda.so libtriton_rust_aoti.so; do strip -o ".carry/$f" "$tgt/$f"; done
for f in gpu_cache_check criteo_fixture stream_client pooled_lookup_bench pool_slots_check; do strip -o ".carry/$f" "$tgt/examples/$f"; done
for f in batch_lookup_bench miss_reads_bench served_reads_bench; do strip -o ".carry_tools/$f" "$tgt/examples/$f"; rm -f ".carry/$f"; done
strip -o .carry/ort_bare "$tgt/examples/ort_bare"
# the kernel tracer (bench/gpu/kernel_trace.c, cache_runs.sh's `...trace` runs): CUPTI's headers
# from the venv's nvidia-cuda-cupti, CUDA's crt/ headers from its triton
v=$(echo .venv/lib/python3*/site-packages)
gcc -O2 -Wall -Wextra -shared -fPIC -I"$v/nvidia/cu13/include" -idirafter "$v/triton/backends/nvidia/include" \
    bench/gpu/kernel_trace.c -o .carry/libkernel_trace.so -ldl -lpthread
bash bench/gpu/build_aoti_bare.sh "$LIBTORCH" .carry/aoti_bare && strip .carry/aoti_bare

# tritonserver: the server binary and its libraries, without libpython (the server does not load it);
# xz -9e: 24.5 MB against -6's 26.4 (about 90 s on 2 cores), room that a call's 64 MiB needs
if [ ! -f .carry/pyt.tar.xz ] || [ .deps/pytriton/tritonserver/bin/tritonserver -nt .carry/pyt.tar.xz ]; then
    tar -C .deps --exclude='libpython*' -cf - pytriton/tritonserver/bin nvidia_pytriton.libs | xz -T2 -9e > .carry/pyt.tar.xz.tmp
    mv .carry/pyt.tar.xz.tmp .carry/pyt.tar.xz
fi

# perf_analyzer 2.60.0 (the machine there cannot download)
mkdir -p .carry_pa
if ! ls .carry_pa/perf_analyzer-2.60.0-*.whl >/dev/null 2>&1; then
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_38_x86_64 perf-analyzer==2.60.0 -d .carry_pa
fi

# onnxruntime-gpu 1.31.1 (built for CUDA 13), in parts of one call each, with zstd to unpack them
if [ "$with_ort" = 1 ]; then
    command -v zstd >/dev/null || { echo "pack.sh --ort needs zstd (apt-get install zstd)" >&2; exit 1; }
    work=/tmp/ort_gpu_pack
    mkdir -p "$work" .carry_ort/tools
    whl="$work/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    [ -f "$whl" ] || "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 onnxruntime-gpu==1.31.1 -d "$work"
    rm -rf "$work/lib" && mkdir -p "$work/lib"
    "$py" - "$whl" "$work/lib" <<'PY'
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in ("libonnxruntime.so.1.31.1", "libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so"):
    with open(os.path.join(sys.argv[2], n), "wb") as f:
        f.write(z.read("onnxruntime/capi/" + n))
PY
    rm -f .carry_ort/ort*.part-*
    tar -C "$work/lib" -cf - . | zstd -12 --long=27 -T2 -q -c | split -b 32M - "$work/part-"
    n=$(ls "$work"/part-* | wc -l)
    # each part's name says how many there are, so that the call bringing the last one can unpack
    for p in "$work"/part-*; do mv "$p" ".carry_ort/ort-of-$n.tar.zst.$(basename "$p")"; done
    cp /usr/bin/zstd .carry_ort/tools/
    cp "$(ldconfig -p | awk '/libzstd.so.1 /{print $NF; exit}')" .carry_ort/tools/libzstd.so.1
    ls -la .carry_ort
fi

ls -la .carry .carry_pa
tree_mb=$(git ls-files -z --cached --others --exclude-standard | du -cm --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "working tree ~${tree_mb} MB; .carry $(du -sm .carry | cut -f1) MB; .carry_pa $(du -sm .carry_pa | cut -f1) MB; .carry_tools $(du -sm .carry_tools | cut -f1) MB (a call carries 64 MiB in all)"

if [ -n "$before" ]; then
    wt="$(mktemp -d)/before"
    git worktree add --detach "$wt" "$before" >/dev/null
    ln -s "$PWD/.venv" "$wt/.venv"; ln -s "$PWD/.deps" "$wt/.deps"
    btgt="${CARGO_TARGET_DIR_BEFORE:-$PWD/target/before}"
    (cd "$wt" && export CARGO_TARGET_DIR="$btgt" && cargo build --release --lib \
        && cargo build --release -p triton_rust_torch && cargo build --release -p triton_rust_aoti)
    mkdir -p .carry_before
    for f in libtriton_rust.so libtriton_rust_torch.so libtriton_rust_torch_cuda.so libtriton_rust_aoti.so; do
        strip -o ".carry_before/$f" "$btgt/release/$f"
    done
    git worktree remove --force "$wt"
    echo ".carry_before: the libraries of $(git rev-parse --short "$before") ($(du -sh .carry_before | cut -f1))"
fi
