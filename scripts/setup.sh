#!/usr/bin/env bash
# Prepare a Debian 12 machine to build and test libtriton_rust.so.
#
#   bash scripts/setup.sh
#
# Idempotent: every step checks whether its result is already there and skips itself, so a
# second run takes a few seconds and downloads nothing. Runs without stdin (no prompts).
#
# Steps:
#   0. Rust toolchain, first, so that a missing one stops the run before the long steps: cargo
#      from PATH or ~/.cargo/bin when it is at least RUST_MIN (Cargo.toml's rust-version);
#      otherwise rustup's stable toolchain, rustup-init fetched from static.rust-lang.org (where
#      sh.rustup.rs's script fetches it from).
#      Where that site cannot be reached, setup stops at once naming the version it needs.
#   1. Debian packages (only the missing ones): compilers, pkg-config, libclang-dev (bindgen),
#      cmake, unzip, curl, python3 + venv + pip.
#   3. Python venv at .venv with the pinned requirements.txt, then requirements-torchrec.txt
#      without dependencies (its header says why).
#   4. The real tritonserver 2.51.0 from the nvidia-pytriton 0.7.0 wheel, unpacked into .deps/,
#      plus .deps/lib symlinks that perf_analyzer needs. Smoke-tested with --help.
#
# Environment knobs:
#   RUSTUP_INIT_URL=<url>   rustup-init's address (default: static.rust-lang.org's, for this machine)
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

# ---------------------------------------------------------------- 0. Rust toolchain
# The one minimum: Cargo.toml's rust-version (the newest any dependency asks for: ort 2.0's).
RUST_MIN="$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' Cargo.toml | head -n1)"
[ -n "$RUST_MIN" ] || die "Cargo.toml names no rust-version"
RUSTUP_INIT_URL="${RUSTUP_INIT_URL:-https://static.rust-lang.org/rustup/dist/$(uname -m)-unknown-linux-gnu/rustup-init}"

version_at_least() { # version_at_least HAVE NEED: HAVE >= NEED, both dotted numbers
    [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}
cargo_version() { cargo --version 2>/dev/null | awk '{print $2}' | sed 's/-.*//'; }

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
have="$(cargo_version || true)"
if [ -n "$have" ] && version_at_least "$have" "$RUST_MIN"; then
    log "cargo $have (needs $RUST_MIN or later)"
else
    why="${have:+cargo $have is older than $RUST_MIN}"; why="${why:-no cargo found}"
    log "$why: installing Rust $RUST_MIN or later with rustup"
    if command -v rustup >/dev/null 2>&1; then
        rustup toolchain install stable --profile default </dev/null \
            && rustup default stable </dev/null \
            || die "$why, and rustup could not install the stable toolchain. This project needs Rust $RUST_MIN or later: install it with rustup (https://rustup.rs) and run this script again."
    else
        fetch_ok=0
        # rustup-init acts by the name it is run as: keep it
        init_dir="$(mktemp -d)"; init="$init_dir/rustup-init"
        if command -v curl >/dev/null 2>&1; then
            curl --proto '=https' --tlsv1.2 -sSf --connect-timeout 15 --max-time 300 "$RUSTUP_INIT_URL" -o "$init" && fetch_ok=1
        elif command -v python3 >/dev/null 2>&1; then
            python3 -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1], timeout=60).read())' \
                "$RUSTUP_INIT_URL" "$init" 2>/dev/null && fetch_ok=1
        fi
        if [ "$fetch_ok" != 1 ]; then
            rm -rf "$init_dir"
            die "$why, and rustup's installer ($RUSTUP_INIT_URL) cannot be reached. This project needs Rust $RUST_MIN or later (Debian 12's own cargo is 1.63): install it with rustup (https://rustup.rs) or put a cargo of $RUST_MIN or later on PATH, then run this script again. Nothing was installed."
        fi
        chmod +x "$init"
        "$init" -y --profile default --no-modify-path </dev/null \
            || { rm -rf "$init_dir"; die "rustup's installer failed; install Rust $RUST_MIN or later with rustup (https://rustup.rs)"; }
        rm -rf "$init_dir"
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    have="$(cargo_version || true)"
    [ -n "$have" ] && version_at_least "$have" "$RUST_MIN" \
        || die "after rustup, cargo is '${have:-missing}'; this project needs Rust $RUST_MIN or later"
    log "cargo $have from rustup (~/.cargo/bin: scripts/env.sh puts it on PATH)"
fi
# The test command checks formatting and lints: rustfmt and clippy come with rustup's default
# profile; a toolchain without them gets them from rustup.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        rustup component add rustfmt clippy </dev/null || warn "rustup could not add rustfmt/clippy"
    else
        warn "cargo fmt or cargo clippy is missing and there is no rustup: the test command needs both"
    fi
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

# ---------------------------------------------------------------- 3. Python venv
REQ_HASH="$(cat requirements.txt requirements-torchrec.txt | sha256sum | cut -d' ' -f1)"
STAMP="$VENV_DIR/.requirements.sha256"
if [ -x "$VENV_DIR/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQ_HASH" ] \
        && "$VENV_DIR/bin/python" -c 'import numpy, onnx, onnxruntime, tritonclient.http, tritonclient.grpc, torchrec' \
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
    log "pip install --no-deps -r requirements-torchrec.txt"
    "$VENV_DIR/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check --no-deps -r requirements-torchrec.txt </dev/null
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
