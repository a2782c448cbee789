# Sourced by the run_*.sh scripts on the GPU machine (from the repository root): $out for
# logs, the machine's CUDA 13 libraries (its torch's cuBLAS and cuDNN, which onnxruntime-gpu
# also needs) on LD_LIBRARY_PATH, and the carried libraries (bench/gpu/pack.sh) installed as
# the rust backend in /tmp/rust_backends ($CARRY: another folder of them, e.g. an earlier build
# for an A/B; default .carry).
out="${OUT:-/tmp/out}"; mkdir -p "$out"
TORCH_DIR=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
SITE=$(dirname "$TORCH_DIR")
export LD_LIBRARY_PATH="/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:$TORCH_DIR/lib:$SITE/nvidia/cu13/lib:$SITE/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /tmp/rust_backends/rust
carry="${CARRY:-.carry}"
cp "$carry/libtriton_rust.so" "$carry/libtriton_rust_torch.so" "$carry/libtriton_rust_torch_cuda.so" /tmp/rust_backends/rust/
echo "backend: $carry ($(md5sum "$carry/libtriton_rust.so" | cut -c1-12))"
