"""crates/cuda/src/kernels/cache.cu, pool.cu and probe.cu, the GPU cache's kernels as one program, compile under NVRTC with no GPU:
as the backend compiles it at run time (no options: PTX for NVRTC's default architecture) and for
an H100 (sm_90), and every kernel the backend loads (crates/cuda/src/kernels.rs) is in the PTX.
NVRTC is the one in torch's CUDA wheel (nvidia/cu13); without it the test is skipped."""
import ctypes
import glob
import os
import re
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
# one program, as src/kernels.rs builds it: cache.cu, then pool.cu, then probe.cu
SOURCES = [os.path.join(ROOT, "crates", "cuda", "src", "kernels", f) for f in ("cache.cu", "pool.cu", "probe.cu")]
LOADER = os.path.join(ROOT, "crates", "cuda", "src", "kernels.rs")


def nvrtc():
    here = [os.path.join(p, "nvidia", "cu13", "lib", "libnvrtc.so.13") for p in sys.path]
    found = [p for p in here if os.path.exists(p)] + glob.glob(
        os.path.join(ROOT, ".venv", "lib", "python3*", "site-packages", "nvidia", "cu13", "lib", "libnvrtc.so.13"))
    if not found:
        pytest.skip("no libnvrtc.so.13 (torch's CUDA wheel) here")
    # NVRTC opens its builtins by name at compile time: loaded first, from beside it
    ctypes.CDLL(os.path.join(os.path.dirname(found[0]), "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(found[0])


def compile_cu(lib, options):
    """(NVRTC's result code, its log, the PTX) for cache.cu with these options."""
    src = b"".join(open(p, "rb").read() for p in SOURCES)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"cache.cu", 0, None, None) == 0
    try:
        opts = (ctypes.c_char_p * max(1, len(options)))(*options)
        rc = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        ptx = b""
        if rc == 0:
            lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetPTX(prog, buf)
            ptx = buf.value
        return rc, log.value.decode(errors="replace"), ptx.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.parametrize("options", [[], [b"--gpu-architecture=compute_90"]], ids=["as-loaded", "sm90"])
def test_cache_kernels_compile_and_hold_every_kernel_loaded(options):
    rc, log, ptx = compile_cu(nvrtc(), options)
    assert rc == 0, log
    with open(LOADER) as f:
        loaded = set(re.findall(r'f\("([a-z0-9_]+)"\)', f.read()))
    assert "batch_lookup_h_s16" in loaded, loaded
    entries = set(re.findall(r"\.entry\s+([A-Za-z0-9_]+)", ptx))
    assert loaded <= entries, sorted(loaded - entries)
