# shellcheck shell=bash
# Source this file (`. scripts/env.sh`) to get the paths set up by scripts/setup.sh.
# It only exports variables; it never installs or downloads anything.
#
#   REPO_ROOT       absolute path of this repository
#   DEPS_DIR        $REPO_ROOT/.deps (the unpacked nvidia-pytriton wheel lives here)
#   TRITONSERVER    the real tritonserver 2.51.0 binary (from nvidia-pytriton 0.7.0)
#   PERF_ANALYZER   perf_analyzer from the tritonclient 2.51.0 wheel (in .venv/bin)
#   ORT_LIB         absolute path of libonnxruntime.so.* from the venv's onnxruntime package
#   LD_LIBRARY_PATH prefixed with .deps/lib (unversioned-name symlinks: libb64.so.0d,
#                   libcudart.so.12 for perf_analyzer) and .deps/nvidia_pytriton.libs
#   PATH            prefixed with .venv/bin (and ~/.cargo/bin, rustup's, when it holds cargo)
#
# tritonserver itself does not need LD_LIBRARY_PATH: its RPATH points at
# ../../../nvidia_pytriton.libs, which is why the wheel layout is kept as is under .deps/.

if [ -n "${BASH_SOURCE[0]:-}" ]; then
    _env_sh_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
else
    _env_sh_dir="$(cd "$(dirname "$0")" && pwd)"
fi
REPO_ROOT="$(cd "$_env_sh_dir/.." && pwd)"
unset _env_sh_dir
export REPO_ROOT

export DEPS_DIR="$REPO_ROOT/.deps"
export VENV_DIR="$REPO_ROOT/.venv"
export TRITONSERVER="$DEPS_DIR/pytriton/tritonserver/bin/tritonserver"
export PERF_ANALYZER="$VENV_DIR/bin/perf_analyzer"

_env_sh_prepend() { # _env_sh_prepend VAR DIR: put DIR first in the colon list VAR, once
    local var="$1" dir="$2" cur
    cur="${!var:-}"
    case ":$cur:" in
        *":$dir:"*) ;;
        *) if [ -n "$cur" ]; then printf -v "$var" '%s:%s' "$dir" "$cur"; else printf -v "$var" '%s' "$dir"; fi ;;
    esac
}
_env_sh_prepend LD_LIBRARY_PATH "$DEPS_DIR/nvidia_pytriton.libs"
_env_sh_prepend LD_LIBRARY_PATH "$DEPS_DIR/lib"
[ -x "$HOME/.cargo/bin/cargo" ] && _env_sh_prepend PATH "$HOME/.cargo/bin"
_env_sh_prepend PATH "$VENV_DIR/bin"
unset -f _env_sh_prepend
export LD_LIBRARY_PATH PATH

ORT_LIB=""
for _env_sh_f in "$VENV_DIR"/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.*; do
    if [ -f "$_env_sh_f" ]; then ORT_LIB="$_env_sh_f"; break; fi
done
unset _env_sh_f
export ORT_LIB

# libtorch 2.11.0 from the venv's torch wheel: the directory the rust backend's torch
# plugin loads libtorch from (--backend-config=rust,libtorch-dir=$LIBTORCH_DIR).
LIBTORCH_DIR=""
for _env_sh_f in "$VENV_DIR"/lib/python3*/site-packages/torch/lib; do
    if [ -f "$_env_sh_f/libtorch_cpu.so" ]; then LIBTORCH_DIR="$_env_sh_f"; fi
done
unset _env_sh_f
export LIBTORCH_DIR
