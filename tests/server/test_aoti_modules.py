"""The AOTInductor plugin's tracking of the CUDA modules a package loads (crates/aoti/src/
modules.cpp). AOTInductor's generated code (torch 2.11) loads each kernel with cuModuleLoad or
cuModuleLoadData and never unloads it; the plugin points the package library's import slots for
those two at hooks that file each module under the package, and unloads them with the model.

There is no GPU driver here, so a small library stands in for libcuda (the three functions,
counting the modules alive) and another for a package library, calling it as the generated
code does; the plugin's routing code (modules.cpp, compiled here as build.rs compiles it into
libtriton_rust_aoti.so, whose exports are the plugin ABI only) runs for real against them, in
package libraries linked three ways: bound lazily, bound at load with a read-only GOT, and
without a PLT (GOT loads). On a GPU: `bench/gpu/run.sh trust reload aoti`.
"""
from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

from tritonserver_harness import REPO_ROOT

MODULES_CPP = os.path.join(REPO_ROOT, "crates", "aoti", "src", "modules.cpp")

DRIVER_C = r"""
static int live = 0;
static long next = 1;
int cuModuleLoad(void **m, const char *path) { if (!path) return 1; *m = (void *)next++; ++live; return 0; }
int cuModuleLoadData(void **m, const void *image) { if (!image) return 1; *m = (void *)next++; ++live; return 0; }
int cuModuleUnload(void *m) { if (!m || live == 0) return 400; --live; return 0; }
int live_modules(void) { return live; }
"""

PACKAGE_C = r"""
int cuModuleLoad(void **m, const char *path);
int cuModuleLoadData(void **m, const void *image);
static const char image[] = "cubin";
int run(void) {
    void *a, *b;
    if (cuModuleLoad(&a, "kernel.cubin")) return 1;
    if (cuModuleLoadData(&b, image)) return 2;
    return 0;
}
"""

# newer generated code (torch 2.15) keeps its handles and unloads them itself
OWN_UNLOAD_C = PACKAGE_C + r"""
int cuModuleUnload(void *m);
int drop(void *m) { return cuModuleUnload(m); }
"""

LINKS = {
    "lazy": ["-Wl,-z,lazy"],
    "now_relro": ["-Wl,-z,relro,-z,now"],
    "no_plt": ["-fno-plt", "-Wl,-z,relro,-z,now"],
}


def cc(out: str, source: str, *flags: str) -> str:
    src = out + ".c"
    with open(src, "w") as f:
        f.write(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", out, src, *flags], check=True)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("modules")
    driver_path = cc(str(root / "libfakecuda.so"), DRIVER_C)
    driver = ctypes.CDLL(driver_path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    routing = str(root / "libmodules.so")
    subprocess.run(["c++", "-shared", "-fPIC", "-O2", "-std=c++20", "-Wall", "-Werror", "-o", routing, MODULES_CPP,
                    "-ldl"], check=True)
    plugin = ctypes.CDLL(routing)
    plugin.tra_modules_track.restype = ctypes.c_void_p
    plugin.tra_modules_track.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int),
                                         ctypes.c_char_p, ctypes.c_size_t]
    plugin.tra_modules_count.restype = ctypes.c_size_t
    plugin.tra_modules_count.argtypes = [ctypes.c_void_p]
    plugin.tra_modules_release.restype = ctypes.c_int
    plugin.tra_modules_release.argtypes = [ctypes.c_void_p]

    def package(name: str, source: str, *flags: str, load: bool = True):
        """A package library under a directory of its own, as the loader unpacks one (loaded,
        unless `load` is false)."""
        d = root / name
        lib_dir = d / "model" / "data" / "aotinductor" / "model"
        lib_dir.mkdir(parents=True)
        path = cc(str(lib_dir / "model.so"), source, f"-L{root}", "-lfakecuda", f"-Wl,-rpath,{root}", *flags)
        return str(d), ctypes.CDLL(path) if load else None

    def track(d: str):
        routed = ctypes.c_int(-1)
        err = ctypes.create_string_buffer(512)
        t = plugin.tra_modules_track(d.encode(), driver_path.encode(), ctypes.byref(routed), err, len(err))
        return t, routed.value, err.value.decode()

    return {"driver": driver, "plugin": plugin, "package": package, "track": track}


@pytest.mark.parametrize("link", list(LINKS))
def test_a_package_libraries_modules_are_unloaded_with_it(built, link):
    driver, plugin = built["driver"], built["plugin"]
    d, lib = built["package"](f"pkg_{link}", PACKAGE_C, *LINKS[link])
    start = driver.live_modules()
    tracker, routed, err = built["track"](d)
    print(f"\n{link}: {routed} import slots routed ({err or 'no error'})")
    assert tracker and routed == 2, err
    assert lib.run() == 0 and lib.run() == 0
    assert driver.live_modules() == start + 4
    assert plugin.tra_modules_count(tracker) == 4
    assert plugin.tra_modules_release(tracker) == 0
    assert driver.live_modules() == start, "the package's modules were not all unloaded"


def test_other_libraries_calls_are_not_routed(built):
    """Only the tracked library's loads are filed; another package's go straight through."""
    driver, plugin = built["driver"], built["plugin"]
    d, lib = built["package"]("pkg_tracked", PACKAGE_C)
    _, other = built["package"]("pkg_other", PACKAGE_C)
    start = driver.live_modules()
    tracker, routed, err = built["track"](d)
    assert tracker and routed == 2, err
    assert other.run() == 0 and lib.run() == 0
    assert plugin.tra_modules_count(tracker) == 2
    assert plugin.tra_modules_release(tracker) == 0
    assert driver.live_modules() == start + 2  # the untracked package's two remain


def test_a_library_opened_through_a_link_is_found_by_its_real_directory(built, tmp_path):
    """The plugin finds the unpacked directory in /proc/self/maps, which shows real paths;
    the loader may have opened the library through a link (a /tmp that is one)."""
    driver, plugin = built["driver"], built["plugin"]
    real, _ = built["package"]("pkg_real", PACKAGE_C, load=False)
    link = tmp_path / "via_link"
    os.symlink(real, link)
    lib = ctypes.CDLL(str(link / "model" / "data" / "aotinductor" / "model" / "model.so"))
    start = driver.live_modules()
    tracker, routed, err = built["track"](os.path.realpath(real))
    assert tracker and routed == 2, err
    assert lib.run() == 0
    assert plugin.tra_modules_count(tracker) == 2
    assert plugin.tra_modules_release(tracker) == 0
    assert driver.live_modules() == start


def test_a_package_that_unloads_its_own_modules_is_left_alone(built):
    d, lib = built["package"]("pkg_own", OWN_UNLOAD_C)
    tracker, routed, err = built["track"](d)
    assert not tracker and routed == 0 and not err


def test_no_library_under_the_directory_is_an_error(built, tmp_path):
    tracker, routed, err = built["track"](str(tmp_path))
    print(f"\n{err}")
    assert not tracker and routed == 0 and "no loaded library under" in err
