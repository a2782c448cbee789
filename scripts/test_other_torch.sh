#!/usr/bin/env bash
# The AOTInductor engine against another torch release from PyPI (default: the newest):
# a venv with that torch (.deps/torch-VERSION), libtriton_rust_aoti.so built against its
# libtorch (build-torch-VERSION/, installed to install-torch-VERSION/backends; the
# TorchScript plugin is left out, as tch needs libtorch 2.11), the example packages exported
# with that torch, and tests/server/test_aoti.py served by that build and libtorch.
# CI runs the same tests with the torch of requirements.txt (scripts/test.sh).
#
#   bash scripts/test_other_torch.sh [VERSION]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
version="${1:-}"
if [ -z "$version" ]; then
    version="$(python -m pip index versions torch 2>/dev/null | sed -n '1s/.*(\(.*\)).*/\1/p')"
    [ -n "$version" ] || { echo "cannot ask PyPI for torch's newest release; name one" >&2; exit 2; }
fi
venv="$DEPS_DIR/torch-$version"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "[other torch] venv with torch==$version at $venv"
    python3 -m venv "$venv"
    grep -v '^torch==' requirements.txt > "$venv/requirements.txt"
    "$venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check "torch==$version" -r "$venv/requirements.txt" </dev/null
fi
torch_dir="$("$venv/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
echo "[other torch] $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)') at $torch_dir"

echo "[other torch] libtriton_rust_aoti.so against it"
LIBTORCH="$torch_dir" cmake -B "build-torch-$version" -S . -DTRITON_RUST_ENABLE_TORCH=OFF \
    -DTRITON_RUST_ENABLE_AOTI=ON -DCMAKE_INSTALL_PREFIX="$PWD/install-torch-$version" \
    -DTRITON_RUST_CARGO_TARGET_DIR="$PWD/target-torch-$version" >/dev/null
LIBTORCH="$torch_dir" cmake --build "build-torch-$version" --target install >/dev/null

echo "[other torch] example packages exported with it"
repo="$PWD/build-torch-$version/models"
mkdir -p "$repo"
cp -r models/*_aoti "$repo/"
"$venv/bin/python" examples/aoti_export.py --repo "$repo" --force

echo "[other torch] tests/server/test_aoti.py"
TRITON_RUST_BACKEND_DIR="$PWD/install-torch-$version/backends" LIBTORCH_DIR="$torch_dir/lib" \
    TRITON_RUST_AOTI_MODELS="$repo" PATH="$venv/bin:$PATH" \
    "$venv/bin/python" -m pytest tests/server/test_aoti.py -q
