#!/usr/bin/env python3
"""The architecture's rules, checked on the workspace (run by scripts/test.sh, so by CI).

1. `unsafe` only in the FFI and CUDA crates: the workspace's lints forbid `unsafe_code`, every
   other crate takes them (`[lints] workspace = true`: the compiler then refuses any `unsafe`),
   no FFI crate does, and no file of the others says `unsafe` outside comments.
2. No engine crate, and not the store or the core, depends on the Triton crate
   (`triton_rust`, `triton-sys`); the core depends on no engine runtime or CUDA library
   (`ort`, `tch`, `cudarc`) — checked on each crate's own resolved dependency tree.
3. No dependency cycle among the workspace's crates (normal and build dependencies).
4. Inside `crates/cuda`, one-way layers: each file's `use crate::...` / `use super::...`
   imports name only files of its own layer or lower ones, and every file has a layer (a new
   file must be placed). In every crate (the root package's `src/` too), the files' imports
   (`use crate::...`, `use super::...`) never form a cycle; and no source file git tracks,
   in any room or language (`.rs`, `.cpp`, `.cu`, `.h`, `.c`, `.py`, `.sh`), is longer than
   600 lines.
5. Inside every crate, no file imports upward into its crate root: what a file below the root
   uses is defined in a module it names (`crate::module::Item`), never in `lib.rs` itself
   (`crate::Item`, or from a file right below the root `super::Item` or `super::*`), so the
   root stays the crate's table of contents. Test modules are exempt.
"""
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from arch_imports import upward_imports

ROOT = Path(__file__).resolve().parent.parent
# The rooms allowed to hold `unsafe`: Triton's C API (the cdylib), CUDA, the OS
# (mmap, dlopen), and the plugin ABI: both sides of it (the ABI crate, the plugin crate that
# fills its table from a plugin's functions) and the two libtorch plugins behind it.
FFI_AND_CUDA = {"triton_rust", "triton_rust_cuda", "triton_rust_os", "triton_rust_abi", "triton_rust_plugin",
               "triton_rust_torch", "triton_rust_aoti"}
# The engine crates a composing engine may build on (its claim's `builds_on`).
COMPOSED = {"triton_rust_engine_recommender": {"triton_rust_engine_embedding", "triton_rust_engine_onnx",
                                               "triton_rust_engine_torch", "triton_rust_engine_aoti"}}
TRITON = {"triton_rust", "triton-sys"}
RUNTIMES = {"ort", "tch", "cudarc", "triton_rust_abi", "triton_rust_plugin", "libloading"}

failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL {msg}")


meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT,
                                 check=True, capture_output=True, text=True).stdout)
members = {p["name"]: p for p in meta["packages"]}

# 1. unsafe
workspace_lints = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"].get("lints", {})
if workspace_lints.get("rust", {}).get("unsafe_code") != "forbid":
    fail("Cargo.toml: [workspace.lints.rust] does not say unsafe_code = \"forbid\"")
for name, pkg in sorted(members.items()):
    manifest = Path(pkg["manifest_path"])
    src = manifest.parent / "src"
    takes = tomllib.loads(manifest.read_text()).get("lints", {}).get("workspace") is True
    if name in FFI_AND_CUDA:
        if takes:
            fail(f"{name}: an FFI crate takes the workspace lints, which forbid the unsafe it needs")
        continue
    if not takes:
        fail(f"{name}: {manifest.relative_to(ROOT)} does not take the workspace lints ([lints] workspace = true)")
    for f in src.rglob("*.rs"):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if re.search(r"\bunsafe\b", code):
                fail(f"{name}: {f.relative_to(ROOT)}:{n} uses unsafe")
print(f"unsafe: only in {sorted(FFI_AND_CUDA & set(members))}; "
      f"forbidden in {sorted(set(members) - FFI_AND_CUDA)}")


# 2. who depends on what, per crate, with that crate's own features
def deps_of(name):
    out = subprocess.run(["cargo", "tree", "-p", name, "-e", "normal,build", "--prefix", "none", "--format", "{p}"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()} - {name}


for name in sorted(members):
    deps = deps_of(name)
    if name != "triton_rust" and deps & TRITON:
        fail(f"{name} depends on the Triton crate: {sorted(deps & TRITON)}")
    if name == "triton_rust_core" and deps & RUNTIMES:
        fail(f"the core depends on {sorted(deps & RUNTIMES)}")
    # engines stand alone; a composing engine (the recommender: a lookup and a network as
    # one model) builds on the engines it composes, and nothing builds on it
    engines = {d for d in deps if d.startswith("triton_rust_engine_")}
    if name.startswith("triton_rust_engine_") and engines - COMPOSED.get(name, set()):
        fail(f"{name} depends on another engine crate: {sorted(engines - COMPOSED.get(name, set()))}")
print("dependencies: no crate but the cdylib reaches triton-sys; the core reaches no ort, tch, cudarc or plugin ABI")

# 3. cycles among workspace crates
graph = {n: {d["name"] for d in p["dependencies"] if d["name"] in members and d.get("kind") in (None, "build")}
         for n, p in members.items()}
state = {}


def visit(n, path):
    if state.get(n) == 1:
        fail("dependency cycle: " + " -> ".join(path + [n]))
        return
    if state.get(n) == 2:
        return
    state[n] = 1
    for d in sorted(graph[n]):
        visit(d, path + [n])
    state[n] = 2


for n in sorted(graph):
    visit(n, [])
order = []
done = set()
while len(done) < len(graph) and not failures:
    layer = sorted(n for n in graph if n not in done and graph[n] <= done)
    if not layer:
        break
    order.append(layer)
    done |= set(layer)
print("layers, bottom up: " + " | ".join(", ".join(layer) for layer in order))

# 4. crates/cuda's layers, bottom up (paths under crates/cuda/src; lib.rs is the root that
# declares them and is not a layer).
CUDA_LAYERS = [
    ("vocabulary", ["error.rs", "fault.rs", "mem.rs"]),
    ("contexts and streams", ["context.rs", "kernels.rs"]),
    ("buffers", ["buffer.rs", "pinned.rs"]),
    ("copies", ["copy.rs", "upload.rs"]),
    ("cache", ["cache/mod.rs", "cache/slots.rs", "cache/rows.rs", "cache/batch_args.rs",
               "cache/batch.rs", "cache/batch_host.rs", "cache/batch_pool.rs", "cache/batch_clock.rs", "cache/pool.rs", "cache/bench.rs"]),
]
MAX_LINES = 600
SOURCES = ("*.rs", "*.cpp", "*.cu", "*.h", "*.c", "*.py", "*.sh")
cuda_src = ROOT / "crates/cuda/src"
layer_of = {f: i for i, (_, files) in enumerate(CUDA_LAYERS) for f in files}


def module_file(path, files):
    """The file of a module path (`["cache", "slots"]`) among `files` (paths under src/; a
    module `m` is `m.rs` or `m/mod.rs`, and `lib.rs` is the root's)."""
    for cand in ("/".join(path) + ".rs", "/".join(path) + "/mod.rs"):
        if cand in files:
            return cand
    return None


def file_imports(rel, text, files):
    """The files among `files` that `rel` imports through `use crate::` or `use super::`
    (`super` from a file `a/b.rs` is `a.rs` or `a/mod.rs`)."""
    here = rel[:-len("/mod.rs")].split("/") if rel.endswith("/mod.rs") else rel[:-3].split("/")
    code = "\n".join(line.split("//", 1)[0] for line in text.splitlines())
    found = set()
    for m in re.finditer(r"\b(crate|super)::((?:\w+::)*)(\{[^;]*?\}|\w+)", code):
        root, mid = m.group(1), [p for p in m.group(2).split("::") if p]
        tail = m.group(3)
        base = [] if root == "crate" else here[:-1]
        heads = [t.strip().split("::")[0] for t in tail.strip("{}").split(",")] if tail.startswith("{") \
            else [tail]
        for head in heads:
            path = base + mid + ([head] if head not in ("self", "") else [])
            # the longest prefix of the path that is a file (`crate::mem::Device` is mem.rs)
            for cut in range(len(path), 0, -1):
                f = module_file(path[:cut], files)
                if f:
                    if f != rel:
                        found.add(f)
                    break
    return found


def strip_tests(text):
    """The file without its `#[cfg(test)] mod tests { ... }` (a test module may import anything)."""
    at = text.find("#[cfg(test)]\nmod tests")
    return text if at < 0 else text[:at]


for f in sorted(cuda_src.rglob("*.rs")):
    rel = f.relative_to(cuda_src).as_posix()
    if rel == "lib.rs":
        continue
    if rel not in layer_of:
        fail(f"crates/cuda/src/{rel} has no layer in check_architecture.py's CUDA_LAYERS")
        continue
    for dep in sorted(file_imports(rel, strip_tests(f.read_text()), layer_of)):
        if layer_of[dep] > layer_of[rel]:
            fail(f"crates/cuda/src/{rel} ({CUDA_LAYERS[layer_of[rel]][0]}) imports {dep}, "
                 f"a higher layer ({CUDA_LAYERS[layer_of[dep]][0]})")
print("crates/cuda layers, bottom up: " + " | ".join(", ".join(files) for _, files in CUDA_LAYERS))


def source_dirs():
    """Every package's src/ (the root package's and each crate's)."""
    for name, pkg in sorted(members.items()):
        src = Path(pkg["manifest_path"]).parent / "src"
        if src.is_dir():
            yield name, src


def check_cycles(name, src):
    """Fails every import cycle among the package's .rs files."""
    files = {f.relative_to(src).as_posix(): f for f in src.rglob("*.rs")}
    graph = {rel: file_imports(rel, strip_tests(f.read_text()), files) for rel, f in files.items()}
    state = {}

    def visit(n, path):
        if state.get(n) == 1:
            fail(f"{name}: import cycle " + " -> ".join(path[path.index(n):] + [n]))
            return
        if state.get(n) == 2:
            return
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            visit(d, path + [n])
        state[n] = 2

    for n in sorted(graph):
        visit(n, [])


for name, src in source_dirs():
    check_cycles(name, src)
# every source file git tracks, whatever its room (crates' src/, examples/, build.rs, the
# kernels, the benches, the tests, the scripts) and language
tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", *SOURCES], capture_output=True,
                         text=True, check=True).stdout.split("\0")
longest = (0, "")
for rel in filter(None, tracked):
    lines = (ROOT / rel).read_text(errors="replace").count("\n")
    longest = max(longest, (lines, rel))
    if lines > MAX_LINES:
        fail(f"{rel} has {lines} lines (more than {MAX_LINES})")
print(f"every package: no import cycle among its files; no source file git tracks over {MAX_LINES} "
      f"lines in {', '.join(SOURCES)} (the longest: {longest[1]}, {longest[0]})")


# 5. no import up into a crate's root (the rule's reading of a crate: scripts/arch_imports.py)
def crate_sources():
    for name, pkg in sorted(members.items()):
        for target in pkg["targets"]:
            if "lib" in target["kind"] or "cdylib" in target["kind"] or "rlib" in target["kind"]:
                yield name, Path(target["src_path"]).parent
                break


for name, src in crate_sources():
    for f, what in upward_imports(src):
        fail(f"{name}: {f.relative_to(ROOT)} imports {what}, an item its crate root defines: "
             f"move it into a module and name that module")
print("no file imports up into its crate's root (every crate)")

if failures:
    sys.exit(f"{len(failures)} architecture rule(s) broken")
print("architecture rules hold")
