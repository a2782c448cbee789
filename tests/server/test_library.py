"""The installed backend library: what it exports, what it links, as include/ says."""
import os
import re
import subprocess

from tritonserver_harness import REPO_ROOT

LIB_DIR = os.path.join(REPO_ROOT, "install", "backends", "rust")
HEADER = os.path.join(REPO_ROOT, "include", "triton_rust", "backend.h")


def exported(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[-1].startswith("TRITONBACKEND_")}


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"Shared library: \[([^\]]+)\]", out)


def test_exports_match_the_header():
    declared = set(re.findall(r"\b(TRITONBACKEND_\w+)\(", open(HEADER).read()))
    got = exported(os.path.join(LIB_DIR, "libtriton_rust.so"))
    print(f"\nexported: {sorted(got)}")
    assert got == declared


def test_backend_links_no_triton_torch_or_onnxruntime():
    libs = needed(os.path.join(LIB_DIR, "libtriton_rust.so"))
    print(f"\nlibtriton_rust.so needs: {libs}")
    assert not [l for l in libs if re.search(r"triton|torch|c10|onnxruntime|cuda", l)], libs


def test_torch_plugin_is_installed_beside_it():
    plugin = os.path.join(LIB_DIR, "libtriton_rust_torch.so")
    assert os.path.exists(plugin)
    assert "libtorch_cpu.so" in needed(plugin)
    assert exported(plugin) == set(), "the plugin exports no Triton entry points"
