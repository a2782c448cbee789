#!/usr/bin/env bash
# Prepare a Debian 12 machine to build and test libtriton_rust.so.
#
#   bash scripts/setup.sh
#
# Idempotent: every step checks whether its result is already there and skips itself, so a
# second run takes a few seconds and downloads nothing. Runs without stdin (no prompts).
#
# Steps:
#   1. Debian packages (only the missing ones): compilers, pkg-config, libclang-dev (bindgen),
#      cmake, unzip, curl, python3 + venv + pip.
#   2. Rust toolchain: use cargo from PATH or ~/.cargo; if none, fall back to Debian's cargo/rustc
#      (old; prefer rustup where its site is reachable).
#   3. Python venv at .venv with the pinned requirements.txt.
#   4. The real tritonserver 2.51.0 from the nvidia-pytriton 0.7.0 wheel, unpacked into .deps/,
#      plus .deps/lib symlinks that perf_analyzer needs. Smoke-tested with --help.
#
# Environment knobs:
#   PYTHON=python3.11       interpreter used to create the venv (default: python3)
#   PYTRITON_WHEEL=<file>   use this local copy of the nvidia-pytriton 0.7.0 wheel
#                           (default /tmp/dl/<wheel> when present; set it empty to force pip)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

PYTRITON_VERSION=0.7.0
PYTRITON_WHEEL_NAME="nvidia_pytriton-${PYTRITON_VERSION}-py3-none-manylinux_2_35_x86_64.whl"
DEPS_DIR="$REPO_ROOT/.deps"
VENV_DIR="$REPO_ROOT/.venv"
PYTHON="${PYTHON:-python3}"

log() { printf '[setup] %s\n' "$*"; }
warn() { printf '[setup] WARNING: %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; fi
fi

# ---------------------------------------------------------------- 1. Debian packages
APT_PACKAGES=(build-essential pkg-config libclang-dev cmake unzip curl ca-certificates
              python3 python3-venv python3-pip redis-server)

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

apt_install() { # apt_install PKG...: install those of PKG that are missing
    local missing=() p
    for p in "$@"; do pkg_installed "$p" || missing+=("$p"); done
    if [ "${#missing[@]}" -eq 0 ]; then return 0; fi
    if ! command -v apt-get >/dev/null 2>&1; then
        die "missing packages ${missing[*]} and no apt-get (this script targets Debian 12)"
    fi
    if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
        die "missing packages ${missing[*]}; run as root or install them first"
    fi
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq </dev/null
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
}

apt_install "${APT_PACKAGES[@]}"

# ---------------------------------------------------------------- 2. Rust toolchain
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if command -v cargo >/dev/null 2>&1; then
    log "cargo: $(cargo --version)"
else
    warn "no cargo found. Install Rust with rustup (https://rustup.rs) for a current toolchain."
    warn "falling back to Debian's cargo/rustc, which may be too old for this crate."
    apt_install cargo rustc
    log "cargo: $(cargo --version)"
fi
# The test command checks formatting and lints: rustfmt and clippy come with rustup's default
# profile; otherwise from rustup (where its site is reachable) or Debian's packages.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        rustup component add rustfmt clippy </dev/null || warn "rustup could not add rustfmt/clippy"
    else
        apt_install rustfmt rust-clippy
    fi
fi

# ---------------------------------------------------------------- 3. Python venv
REQ_HASH="$(sha256sum requirements.txt | cut -d' ' -f1)"
STAMP="$VENV_DIR/.requirements.sha256"
if [ -x "$VENV_DIR/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQ_HASH" ] \
        && "$VENV_DIR/bin/python" -c 'import numpy, onnx, onnxruntime, tritonclient.http, tritonclient.grpc' \
            >/dev/null 2>&1; then
    log "venv up to date: $VENV_DIR"
else
    if [ ! -x "$VENV_DIR/bin/python" ]; then
        log "creating venv $VENV_DIR with $($PYTHON --version 2>&1)"
        "$PYTHON" -m venv "$VENV_DIR"
    fi
    log "pip install -r requirements.txt"
    "$VENV_DIR/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check --upgrade pip </dev/null
    "$VENV_DIR/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check -r requirements.txt </dev/null
    echo "$REQ_HASH" > "$STAMP"
fi

# ---------------------------------------------------------------- 4. tritonserver
WHEEL_DIR="$DEPS_DIR/wheels"
WHEEL="$WHEEL_DIR/$PYTRITON_WHEEL_NAME"
TRITONSERVER="$DEPS_DIR/pytriton/tritonserver/bin/tritonserver"
mkdir -p "$WHEEL_DIR"

if [ ! -f "$TRITONSERVER" ]; then
    if [ ! -f "$WHEEL" ]; then
        # PYTRITON_WHEEL unset: try the copy a previous download left in /tmp/dl;
        # PYTRITON_WHEEL= (empty): always download.
        for cand in "${PYTRITON_WHEEL-/tmp/dl/$PYTRITON_WHEEL_NAME}"; do
            if [ -n "$cand" ] && [ -f "$cand" ]; then
                log "using local wheel $cand"
                cp "$cand" "$WHEEL.part" && mv "$WHEEL.part" "$WHEEL"
                break
            fi
        done
    fi
    if [ ! -f "$WHEEL" ]; then
        log "downloading nvidia-pytriton==$PYTRITON_VERSION (about 55 MB)"
        "$VENV_DIR/bin/python" -m pip download -q --no-cache-dir --disable-pip-version-check --no-deps \
            "nvidia-pytriton==$PYTRITON_VERSION" -d "$WHEEL_DIR" </dev/null
        [ -f "$WHEEL" ] || die "pip download did not produce $WHEEL"
    fi
    log "unpacking tritonserver into $DEPS_DIR"
    rm -rf "$DEPS_DIR/pytriton" "$DEPS_DIR/nvidia_pytriton.libs" "$DEPS_DIR/unpack.tmp"
    unzip -q -o "$WHEEL" 'pytriton/tritonserver/*' 'nvidia_pytriton.libs/*' -d "$DEPS_DIR/unpack.tmp"
    mv "$DEPS_DIR/unpack.tmp/pytriton" "$DEPS_DIR/pytriton"
    mv "$DEPS_DIR/unpack.tmp/nvidia_pytriton.libs" "$DEPS_DIR/nvidia_pytriton.libs"
    rmdir "$DEPS_DIR/unpack.tmp"
    chmod +x "$TRITONSERVER"
else
    log "tritonserver present: $TRITONSERVER"
fi

# perf_analyzer (tritonclient wheel) asks for the plain sonames libb64.so.0d and libcudart.so.12;
# the pytriton wheel has them under hashed names. Link them into .deps/lib.
mkdir -p "$DEPS_DIR/lib"
link_lib() { # link_lib SONAME PATTERN
    local target
    target="$(cd "$DEPS_DIR/nvidia_pytriton.libs" && ls $2 2>/dev/null | head -n1 || true)"
    [ -n "$target" ] || die "no $2 in $DEPS_DIR/nvidia_pytriton.libs"
    ln -sfn "../nvidia_pytriton.libs/$target" "$DEPS_DIR/lib/$1"
}
link_lib libb64.so.0d 'libb64-*.so.0d'
link_lib libcudart.so.12 'libcudart-*.so.12*'

# Smoke test: the binary loads all its libraries and prints its usage.
# (tritonserver --help exits 1; look at the text instead.)
ts_out="$("$TRITONSERVER" --help 2>&1 || true)"
if ! grep -q "Usage: tritonserver" <<<"$ts_out"; then
    printf '%s\n' "$ts_out" | head -n 20 >&2
    die "tritonserver does not start; see above (try: ldd $TRITONSERVER)"
fi
if ldd "$TRITONSERVER" | grep -q "not found"; then
    ldd "$TRITONSERVER" | grep "not found" >&2
    die "tritonserver has unresolved libraries"
fi
log "tritonserver OK"

# ---------------------------------------------------------------- 5. real-world ONNX models
# ONNX models written outside this project, as PyPI packages ship them (tests/server/
# test_real_onnx.py serves them against ONNX Runtime's own results). Downloaded, not installed.
MODEL_WHEELS="$DEPS_DIR/model-wheels"
mkdir -p "$MODEL_WHEELS"
for spec in silero-vad==6.2.3 rapidocr-onnxruntime==1.4.4 pipecat-ai==1.14.0; do
    name="${spec%%==*}"; version="${spec##*==}"
    if ! ls "$MODEL_WHEELS/${name//-/_}-$version-"*.whl >/dev/null 2>&1; then
        log "downloading $spec (its ONNX models)"
        "$VENV_DIR/bin/python" -m pip download -q --no-cache-dir --disable-pip-version-check --no-deps --only-binary=:all: \
            "$spec" -d "$MODEL_WHEELS" </dev/null
    fi
done

# shellcheck source=scripts/env.sh
. "$REPO_ROOT/scripts/env.sh"
if [ -x "$PERF_ANALYZER" ]; then
    pa_out="$("$PERF_ANALYZER" --help 2>&1 || true)"
    if grep -q "error while loading shared libraries" <<<"$pa_out"; then
        warn "perf_analyzer cannot load its libraries: $(head -n1 <<<"$pa_out")"
    else
        log "perf_analyzer OK"
    fi
fi
[ -n "$ORT_LIB" ] && [ -f "$ORT_LIB" ] || die "onnxruntime library not found in $VENV_DIR"

log "done. Use: . scripts/env.sh"
log "  TRITONSERVER=$TRITONSERVER"
log "  ORT_LIB=$ORT_LIB"
log "  LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
