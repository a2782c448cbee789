"""The AOTInductor engine (libtriton_rust_aoti.so) through the real tritonserver: the example
packages (examples/aoti_export.py; made by scripts/export_models.sh, or here when missing)
served under dynamic batching, with requests of mixed batch sizes sent at once over HTTP and
gRPC, equal to eager PyTorch of the same module and weights; `platform: "torch_aoti"`; a config
auto-completed from the package; and the clean failures: a package of a newer torch, a CUDA
package on a KIND_CPU instance, nothing unpacked left after an unload, and a package without
our metadata served through its call spec (ARGS[i] / KWARGS[name]).

TRITON_RUST_AOTI_MODELS names another repository holding the *_aoti models
(scripts/test_other_torch.sh: packages exported with another torch release).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import pytest
import torch

from conftest import module_server
from tritonserver_harness import MODELS_DIR, REPO_ROOT, ModelRepo, infer, make_client

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
import aoti_export  # noqa: E402
import recommenders  # noqa: E402
import torch_models  # noqa: E402

AOTI_MODELS = os.environ.get("TRITON_RUST_AOTI_MODELS") or MODELS_DIR
SERVED = aoti_export.CPU_MODELS
# max |served - eager torch| allowed, CPU fp32. Measured with torch 2.11 on a 2-core AVX-512
# machine: the packages in Python (aoti_load_package, batches 1-64) 1.3e-7 (resnet50, logits up to
# 0.25), 2.4e-7 (bert_small), 0-1.2e-7 (recommenders); served, batched by Triton: resnet50 1.8e-7,
# bert_small 3.0e-7, recommenders 2.4e-7 to 7.2e-7 (dcnv2). Inductor fuses and reorders float
# sums and the GEMMs block by batch size: close, not bitwise; the bound leaves room for that.
# FastPitch against the TorchScript twin's eager module (the package is of its rewrite with the
# decoder's convolutions as matrix products): 5.7e-6 at batches 1-8 in Python; its mel frames
# past a request's own longest item (the merged batch's longest) must be zero.
TOLERANCE = {name: 1e-5 for name in aoti_export.CPU_MODELS}
TOLERANCE["fastpitch_aoti"] = 2e-5
# batch sizes of the concurrent requests (each within max_batch_size; together more than one batch)
MIXED = {"resnet50_aoti": [1, 3, 2, 4, 1, 2], "bert_small_aoti": [1, 3, 2, 4, 1, 2, 5, 1],
         "fastpitch_aoti": [1, 2, 1, 3, 1, 2]}
DENSE_MIXED = [1, 7, 32, 3, 64, 5, 16, 2]

# ------------------------------------------------------------------ inputs and references


def feeds(name: str, batch: int, seed: int):
    """({input name: array}, [output names]) of one request to `name`."""
    rng = np.random.default_rng(seed)
    if name == "resnet50_aoti":
        return {"INPUT__0": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}, ["OUTPUT__0"]
    if name == "bert_small_aoti":
        ids = rng.integers(1, 30522, (batch, 384)).astype(np.int32)
        seg = np.zeros((batch, 384), np.int32)
        seg[:, 150 + seed % 50:] = 1
        mask = np.ones((batch, 384), np.int32)
        mask[:, 300 - seed % 64:] = 0
        return {"INPUT__0": ids, "INPUT__1": seg, "INPUT__2": mask}, ["OUTPUT__0", "OUTPUT__1"]
    if name == "fastpitch_aoti":
        ids = torch_models.fastpitch_inputs(batch, seed=seed, min_len=8, max_len=128).numpy()
        return {"INPUT__0": ids}, ["OUTPUT__0", "OUTPUT__1", "OUTPUT__2", "OUTPUT__3"]
    if name == "dlrm_aoti":
        dense, sparse = recommenders.sample_inputs(batch, aoti_export.ROWS, seed=seed, unknown=min(batch, 2))
        return {"dense": dense, "sparse": sparse}, ["prediction"]
    dim = 65 if name.startswith("wide_deep") else 128
    dense = rng.standard_normal((batch, 13), dtype=np.float32)
    emb = rng.standard_normal((batch, 26, dim), dtype=np.float32)
    if name == "dlrm_dense_aoti":
        return {"dense": dense, "embeddings": emb}, ["prediction"]
    return {"INPUT__0": dense, "INPUT__1": emb}, ["OUTPUT__0"]


_MODULES: dict = {}


def reference(name: str, inputs: dict) -> list:
    """Eager PyTorch of the module the package was exported from, on the same inputs."""
    if name == "dlrm_aoti":
        if name not in _MODULES:
            _MODULES[name] = aoti_export.recommender("dlrm")
        return [recommenders.reference_predict(_MODULES[name], inputs["dense"], inputs["sparse"])]
    if name not in _MODULES:
        # FastPitch: the TorchScript twin's module itself, not the rewrite that was exported
        _MODULES[name] = torch_models.make("fastpitch") if name == "fastpitch_aoti" else aoti_export.reference(name)
    with torch.no_grad():
        out = _MODULES[name](*[torch.from_numpy(x) for x in inputs.values()])
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


# ------------------------------------------------------------------ packages and copies


def rewrite_metadata(src: str, dst: str, **changes: str) -> None:
    """A copy of package `src` whose *_metadata.json entries have `changes` (the entries are
    stored, not compressed; the others are copied as they are)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    seen = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("_metadata.json"):
                meta = json.loads(data)
                meta.update(changes)
                data = json.dumps(meta).encode()
                seen += 1
            zout.writestr(info, data, compress_type=info.compress_type)
    assert seen, f"no *_metadata.json in {src}"


def break_library(src: str, dst: str) -> None:
    """A copy of package `src` whose compiled library is not a library: the loader unpacks it,
    then fails to open it."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        broken = 0
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(".so"):
                data, broken = b"not an ELF file" * 64, broken + 1
            zout.writestr(info, data, compress_type=info.compress_type)
    assert broken, f"no library in {src}"


def link_model(repo: ModelRepo, src_repo: str, name: str, as_name: str | None = None, edit=lambda c: c) -> None:
    """`name` of `src_repo` into `repo` (its version directory linked, its config copied)."""
    dst = as_name or name
    os.makedirs(os.path.join(repo.root, dst), exist_ok=True)
    os.symlink(os.path.join(src_repo, name, "1"), os.path.join(repo.root, dst, "1"))
    with open(os.path.join(src_repo, name, "config.pbtxt")) as f:
        config = f.read()
    repo.write_config(dst, edit(config.replace(f'name: "{name}"', f'name: "{dst}"')))


class Scaled(torch.nn.Module):
    """A keyword argument and no triton_rust.* metadata: names through the call spec."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, *, scale):
        return self.lin(x) * scale


SCALED_CONFIG = """name: "scaled_kwargs"
backend: "rust"
max_batch_size: 8
input [
  { name: "KWARGS[scale]" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "ARGS[0]" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "engine" value { string_value: "aoti" } }
"""


@pytest.fixture(scope="session")
def scaled_package(tmp_path_factory):
    """Plain torch.export + aoti_compile_and_package, no metadata of ours (about 30 s)."""
    path = str(tmp_path_factory.mktemp("scaled") / "model.pt2")
    batch = torch.export.Dim("batch", min=1, max=8)
    x, scale = torch.randn(2, 4), torch.randn(2, 3)
    with torch.no_grad():
        ep = torch.export.export(Scaled().eval(), (x,), kwargs={"scale": scale},
                                 dynamic_shapes={"x": {0: batch}, "scale": {0: batch}})
        torch._inductor.aoti_compile_and_package(ep, package_path=path)
    with zipfile.ZipFile(path) as z:
        meta = [json.loads(z.read(n)) for n in z.namelist() if n.endswith("_metadata.json")]
    assert meta and not any(k.startswith("triton_rust.") for m in meta for k in m)
    return path


@pytest.fixture(scope="module")
def packages(example_models):
    missing = [m for m in SERVED if not os.path.isfile(aoti_export.package_file(AOTI_MODELS, m))]
    if missing:
        print(f"\n[aoti] exporting {missing} into {AOTI_MODELS}", flush=True)
        subprocess.run([sys.executable, os.path.join(REPO_ROOT, "examples", "aoti_export.py"), "--repo", AOTI_MODELS,
                        "--models", ",".join(missing)], check=True)
    return AOTI_MODELS


@pytest.fixture(scope="module")
def repo(tmp_path_factory, packages, scaled_package):
    repo = ModelRepo(str(tmp_path_factory.mktemp("aoti-repo")))
    for name in SERVED:
        link_model(repo, packages, name)
    src = os.path.join(packages, "wide_deep_dense_aoti", "1", "model.pt2")
    for as_name, change in (("wide_deep_future", {"triton_rust.torch_version": "2.99.0"}),
                            ("wide_deep_cuda", {"AOTI_DEVICE_KEY": "cuda"}),
                            ("wide_deep_isa", {"AOTI_CPU_ISA": f"AVX2 {isa_this_cpu_lacks() or 'AVX512'}"})):
        rewrite_metadata(src, os.path.join(repo.root, as_name, "1", "model.pt2"), **change)
        with open(os.path.join(packages, "wide_deep_dense_aoti", "config.pbtxt")) as f:
            repo.write_config(as_name, f.read().replace('name: "wide_deep_dense_aoti"', f'name: "{as_name}"'))
    break_library(src, os.path.join(repo.root, "wide_deep_broken", "1", "model.pt2"))
    with open(os.path.join(packages, "wide_deep_dense_aoti", "config.pbtxt")) as f:
        repo.write_config("wide_deep_broken", f.read().replace('name: "wide_deep_dense_aoti"', 'name: "wide_deep_broken"'))
    os.makedirs(os.path.join(repo.root, "scaled_kwargs", "1"))
    shutil.copy(scaled_package, os.path.join(repo.root, "scaled_kwargs", "1", "model.pt2"))
    repo.write_config("scaled_kwargs", SCALED_CONFIG)
    return repo


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo, "--model-control-mode=explicit",
                         *[f"--load-model={m}" for m in (*SERVED, "scaled_kwargs")])


# ------------------------------------------------------------------ serving


def success_count(stats: dict) -> int:
    return int(stats["inference_stats"]["success"]["count"])


def own_frames(name: str, output: str, got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """FastPitch's mel of a request merged with others has the merged batch's frame count:
    the frames past the request's own longest item must be zero, and are cut off here."""
    if name != "fastpitch_aoti" or output != "OUTPUT__0" or got.ndim != 3 or got.shape[2] <= want.shape[2]:
        return got
    assert not np.any(got[:, :, want.shape[2]:]), f"{name}: mel frames past the request's length are not zero"
    return got[:, :, :want.shape[2]]


@pytest.mark.parametrize("name", SERVED)
def test_mixed_batches_at_once_equal_eager_torch(server, name):
    """Requests of mixed batch sizes, half over HTTP and half over gRPC, sent together: the
    dynamic batcher merges them (fewer executions than requests) and every answer equals
    eager PyTorch of the same module."""
    sizes = MIXED.get(name, DENSE_MIXED)
    requests = [feeds(name, b, seed=100 + i) for i, b in enumerate(sizes)]
    answers: list = [None] * len(sizes)
    start = threading.Barrier(len(sizes))

    def send(i: int) -> None:
        protocol = ("http", "grpc")[i % 2]
        client = make_client(server, protocol)
        inputs, outputs = requests[i]
        start.wait()
        try:
            answers[i] = infer(client, protocol, name, inputs, outputs)
        except Exception as e:  # noqa: BLE001 - reported below with the request it belongs to
            answers[i] = e
        client.close()

    before = server.stats(name)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(sizes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = server.stats_after(name, before, len(sizes))
    runs = after["execution_count"] - before["execution_count"]
    served = success_count(after) - success_count(before)
    worst = 0.0
    for i, (b, (inputs, outputs)) in enumerate(zip(sizes, requests)):
        assert not isinstance(answers[i], Exception), f"request {i} (batch {b}): {answers[i]}"
        for out, want in zip(outputs, reference(name, inputs)):
            got = own_frames(name, out, answers[i][out], want)
            assert got.shape == want.shape, (name, out, got.shape, want.shape)
            worst = max(worst, float(np.abs(got.astype(np.float64) - want).max()))
    print(f"\n{name}: {served} requests of batch sizes {sizes} ran in {runs} executions; "
          f"max |served - eager torch| = {worst:.3g}")
    assert served == len(sizes)
    assert runs < served, "the dynamic batcher merged no requests"
    assert worst <= TOLERANCE[name], f"{name}: {worst} > {TOLERANCE[name]}"


def test_config_auto_completed_from_the_package(server):
    r = server.http("GET", "/v2/models/resnet50_aoti/config")
    r.raise_for_status()
    config = r.json()
    print(f"\nresnet50_aoti config: inputs {config['input']} outputs {config['output']}")
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]] == \
        [("INPUT__0", "TYPE_FP32", [3, 224, 224])]
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["output"]] == \
        [("OUTPUT__0", "TYPE_FP32", [1000])]
    assert config["max_batch_size"] == 8
    r = server.http("GET", "/v2/models/fastpitch_aoti/config")
    r.raise_for_status()
    outputs = [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in r.json()["output"]]
    print(f"fastpitch_aoti outputs: {outputs}")
    assert outputs == [("OUTPUT__0", "TYPE_FP32", [80, -1]), ("OUTPUT__1", "TYPE_INT64", [1]),
                       ("OUTPUT__2", "TYPE_FP32", [128]), ("OUTPUT__3", "TYPE_FP32", [128])]


def test_platform_torch_aoti_selects_the_engine(server):
    for name in ("bert_small_aoti", "dcnv2_dense_aoti"):
        with open(os.path.join(server.model_repository, name, "config.pbtxt")) as f:
            text = f.read()
        assert 'platform: "torch_aoti"' in text and '"engine"' not in text
        assert server.model_ready(name)
        r = server.http("GET", f"/v2/models/{name}/config")
        r.raise_for_status()
        assert r.json().get("platform") == "torch_aoti", r.json()


def test_package_without_metadata_takes_args_and_kwargs_by_call_spec(server):
    """The config lists KWARGS[scale] before ARGS[0]: the package's call spec places them."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4), dtype=np.float32)
    scale = rng.standard_normal((5, 3), dtype=np.float32)
    with torch.no_grad():
        want = Scaled().eval()(torch.from_numpy(x), scale=torch.from_numpy(scale)).numpy()
    for protocol in ("http", "grpc"):
        client = make_client(server, protocol)
        got = infer(client, protocol, "scaled_kwargs", {"KWARGS[scale]": scale, "ARGS[0]": x}, ["OUTPUT__0"])["OUTPUT__0"]
        client.close()
        diff = float(np.abs(got - want).max())
        print(f"\nscaled_kwargs ({protocol}): max |served - eager| = {diff:.3g}")
        assert got.shape == (5, 3) and diff <= 1e-6


# ------------------------------------------------------------------ clean failures


def package_ranges(name: str) -> dict:
    with zipfile.ZipFile(aoti_export.package_file(AOTI_MODELS, name)) as z:
        meta = [json.loads(z.read(n)) for n in z.namelist() if n.endswith("wrapper_metadata.json")]
    return {t["name"]: t.get("range") for t in json.loads(meta[0][aoti_export.INPUTS_KEY])}


@pytest.mark.parametrize("name,input_name,value,want", [
    ("fastpitch_aoti", "INPUT__0", 500, "holds 500 at element 3, outside [0, 148)"),
    ("fastpitch_aoti", "INPUT__0", -1, "holds -1 at element 3, outside [0, 148)"),
    ("bert_small_aoti", "INPUT__0", 30522, "holds 30522 at element 3, outside [0, 30522)"),
    ("bert_small_aoti", "INPUT__1", 2, "holds 2 at element 3, outside [0, 2)"),
])
def test_an_index_past_its_table_fails_that_request_only(server, name, input_name, value, want):
    """An index outside an embedding table: the compiled CPU kernel's check would throw inside
    an OpenMP region and end the server, so the engine checks the range the package records
    (examples/aoti_export.py, index_ranges) per request. Sent at once with good requests
    that the batcher merges it with: the bad one is refused naming the input and the value,
    the others are answered equal to eager torch."""
    assert package_ranges(name)[input_name], f"{name}'s package records no range for {input_name}: export it again"
    requests = [feeds(name, 2, seed=200 + i) for i in range(3)]
    bad_inputs = {k: v.copy() for k, v in requests[1][0].items()}
    bad_inputs[input_name][0, 3] = value
    requests[1] = (bad_inputs, requests[1][1])
    answers: list = [None] * 3
    start = threading.Barrier(3)

    def send(i: int) -> None:
        client = make_client(server, "grpc")
        start.wait()
        try:
            answers[i] = infer(client, "grpc", name, *requests[i])
        except Exception as e:  # noqa: BLE001 - the refusal is what is checked
            answers[i] = e
        client.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"\n{name} {input_name}={value}: {answers[1]}")
    assert isinstance(answers[1], Exception) and input_name in str(answers[1]) and want in str(answers[1])
    for i in (0, 2):
        assert not isinstance(answers[i], Exception), answers[i]
        for out, ref in zip(requests[i][1], reference(name, requests[i][0])):
            got = own_frames(name, out, answers[i][out], ref)
            assert float(np.abs(got.astype(np.float64) - ref).max()) <= TOLERANCE[name]
    assert server.alive()


def still_serving(server) -> None:
    inputs, outputs = feeds("dcnv2_dense_aoti", 3, seed=9)
    got = infer(make_client(server, "http"), "http", "dcnv2_dense_aoti", inputs, outputs)["OUTPUT__0"]
    assert float(np.abs(got - reference("dcnv2_dense_aoti", inputs)[0]).max()) <= TOLERANCE["dcnv2_dense_aoti"]
    assert server.alive() and "panicked" not in server.log_text()


def isa_this_cpu_lacks() -> str | None:
    """One of Inductor's CPU instruction-set names (AOTI_CPU_ISA) this machine's CPU lacks."""
    with open("/proc/cpuinfo") as f:
        flags = set(next((line for line in f if line.startswith("flags")), "").split())
    for name, flag in (("AMX_TILE", "amx_tile"), ("AVX512_VNNI", "avx512_vnni"), ("AVX512", "avx512f")):
        if flag not in flags:
            return name
    return None


@pytest.mark.parametrize("name,named", [
    ("wide_deep_future", "2.99.0"),  # a package of a newer torch, refused naming its release
    ("wide_deep_cuda", "KIND_GPU"),  # a CUDA package on a KIND_CPU instance, refused naming KIND_GPU
    # a CPU package whose kernels use instructions this CPU lacks, refused naming them
    ("wide_deep_isa", isa_this_cpu_lacks() or "(this CPU has every instruction set Inductor names)"),
])
def test_a_package_this_instance_cannot_run_is_refused_naming_why(server, name, named):
    if name == "wide_deep_isa" and not isa_this_cpu_lacks():
        pytest.skip("this CPU has AMX, AVX-512 and VNNI: no package can ask for more")
    r = server.load(name)
    msg = r.json().get("error", "")
    print(f"\n{name}: {r.status_code} {msg}")
    assert r.status_code == 400 and named in msg
    assert not server.model_ready(name)
    still_serving(server)


def unpacked_in_tmp() -> set:
    """The folders in /tmp holding an unpacked package (libtorch 2.11 unpacks into /tmp/XXXXXX)."""
    return {d for d in glob.glob("/tmp/??????") if glob.glob(os.path.join(d, "*", "data", "aotinductor"))}


def test_a_package_that_fails_to_load_leaves_nothing_unpacked(server):
    """The loader unpacks the package before it opens its library; when that fails, what it
    unpacked is removed, and the server goes on."""
    before = unpacked_in_tmp()
    r = server.load("wide_deep_broken")
    msg = r.json().get("error", "")
    print(f"\nwide_deep_broken: {r.status_code} {msg}")
    assert r.status_code == 400 and "wide_deep_broken" in msg
    assert not server.model_ready("wide_deep_broken")
    left = sorted(unpacked_in_tmp() - before)
    assert not left, f"left in /tmp by the failed load: {left}"
    still_serving(server)


def listing(root: str) -> set:
    return {os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files}


def unpacked_dirs(pid: int) -> set:
    """The directories holding the package libraries process `pid` has mapped
    (`<dir>/<package>/data/aotinductor/...`)."""
    with open(f"/proc/{pid}/maps") as f:
        files = {line.split(maxsplit=5)[-1].strip() for line in f if "/data/aotinductor/" in line}
    return {os.path.dirname(p.split("/data/aotinductor/")[0]) for p in files}


def test_unload_leaves_nothing_unpacked(start_server, packages, tmp_path):
    """libtorch's loader unpacks the package's libraries into a fresh temporary directory (in
    libtorch 2.11 always a /tmp/XXXXXX one, whatever TMPDIR says); the unload removes it, and
    the server's own TMPDIR is as it was before the load."""
    tmpdir = tmp_path / "server-tmp"
    tmpdir.mkdir()
    repo = ModelRepo(str(tmp_path / "repo"))
    link_model(repo, packages, "bert_small_aoti")
    srv = start_server(repo.root, "--model-control-mode=explicit", env={"TMPDIR": str(tmpdir)})
    before = listing(str(tmpdir))
    assert not unpacked_dirs(srv.pid)
    r = srv.load("bert_small_aoti")
    assert r.status_code == 200, r.text
    unpacked = unpacked_dirs(srv.pid)
    print(f"\nunpacked into {sorted(unpacked)}; TMPDIR {tmpdir}: {len(listing(str(tmpdir)) - before)} new entries")
    assert unpacked and all(os.path.isdir(d) for d in unpacked), unpacked
    inputs, outputs = feeds("bert_small_aoti", 2, seed=4)
    got = infer(make_client(srv, "http"), "http", "bert_small_aoti", inputs, outputs)
    assert float(np.abs(got["OUTPUT__0"] - reference("bert_small_aoti", inputs)[0]).max()) <= TOLERANCE["bert_small_aoti"]
    assert srv.unload("bert_small_aoti").status_code == 200

    def clean() -> bool:
        return not any(os.path.exists(d) for d in unpacked) and listing(str(tmpdir)) == before

    deadline = time.monotonic() + 30
    while (srv.model_ready("bert_small_aoti") or not clean()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = sorted(d for d in unpacked if os.path.exists(d)) + sorted(listing(str(tmpdir)) - before)
    print(f"after unload: {left} left")
    assert not srv.model_ready("bert_small_aoti")
    assert not left, f"left after unload: {left[:10]}"
    assert srv.alive()
