"""docs/torchrec.md's "Your collection, step by step", run as written with the real torchrec,
and what the page promises, through the real tritonserver:

- the page's KJT is answered equal to the collection's own output (`ebc(kjt)`);
- KJTs of 1 to 40 samples, with empty bags, sent at once, are batched together by Triton and
  each answered equal to the collection's output on it;
- malformed lengths or an id past its table fail their own request with a 400 naming the input,
  while the requests batched with them are answered;
- the same samples sent as one KJT and as one request a sample: what each costs is printed
  (no speed is asserted; it is a figure, not a test).
"""
from __future__ import annotations

import os
import re
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchrec = pytest.importorskip("torchrec")  # scripts/setup.sh installs it (requirements-torchrec.txt)

from conftest import module_server  # noqa: E402
from tritonserver_harness import REPO_ROOT, ModelRepo, fire_grpc  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
from torchrec_client import kjt_inputs  # noqa: E402

DOC = os.path.join(REPO_ROOT, "docs", "torchrec.md")
SECTION = "## Your collection, step by step"


def recipe_blocks():
    """(python blocks, [(path, text)] of the config blocks, bash blocks) of the section."""
    text = open(DOC).read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end > 0 else len(text)]
    python, files, shell = [], [], []
    for m in re.finditer(r"```(\w*)\n(.*?)```", section, re.S):
        lang, body = m.group(1), m.group(2)
        if lang == "python":
            python.append(body)
        elif lang == "bash":
            shell.append(body)
        else:
            before = section[:m.start()].rstrip().splitlines()[-1]
            named = re.findall(r"`([\w./-]+/config\.pbtxt)`", before)
            assert named, f"a config block in {SECTION!r} follows no `.../config.pbtxt`: {before!r}"
            files.append((named[-1], body))
    return python, files, shell


def run_blocks(blocks, space, work):
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for block in blocks:
            exec(compile(block, DOC, "exec"), space)  # noqa: S102 - the page's own code, as a user runs it
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """The section's steps before the server, run as written in a folder that looks like the
    repository's root (its examples/): the namespace and the folder."""
    work = str(tmp_path_factory.mktemp("torchrec-recipe"))
    os.symlink(os.path.join(REPO_ROOT, "examples"), os.path.join(work, "examples"))
    python, files, shell = recipe_blocks()
    assert len(python) == 3 and files and shell, "the recipe lost its code blocks"
    assert "--model-repository=torchrec_repo" in shell[0]
    space: dict = {"__name__": "recipe"}
    run_blocks(python[:2], space, work)
    for path, body in files:
        with open(os.path.join(work, path), "w") as f:
            f.write(body)
    return space, work, python[2]


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, recipe):
    _, work, _ = recipe
    return module_server(request, tmp_path_factory, ModelRepo(os.path.join(work, "torchrec_repo")))


def expected(ebc, kjt) -> np.ndarray:
    with torch.no_grad():
        out = ebc(kjt)
    return out.values().numpy().reshape(kjt.stride(), len(out.keys()), -1)


def random_kjt(rng, samples: int, rows=(1000, 5000, 300), empty_share: float = 0.25):
    """A KJT over the page's three features, bags of 0..6 ids (a share of them empty)."""
    lengths = rng.integers(1, 7, size=(len(rows), samples))
    lengths[rng.random(lengths.shape) < empty_share] = 0
    values = np.concatenate([rng.integers(0, rows[f], size=int(n)) for f in range(len(rows))
                             for n in lengths[f]] or [np.zeros(0, np.int64)])
    return torchrec.KeyedJaggedTensor.from_lengths_sync(
        keys=["user", "item", "city"], values=torch.from_numpy(values.astype(np.int64)),
        lengths=torch.from_numpy(lengths.reshape(-1).astype(np.int32)))


def test_the_recipe_answers_equal_to_the_collection(server, recipe):
    space, work, client_block = recipe
    os.environ["TRITON_HTTP"] = server.http_url.replace("http://", "")
    try:
        run_blocks([client_block], space, work)
    finally:
        del os.environ["TRITON_HTTP"]
    served, want = space["served"], space["expected"]
    assert served.shape == (3, 3, 16)
    assert not served[2, 0].any(), "sample 2's empty 'user' bag pools to zeros"
    np.testing.assert_allclose(served, want, rtol=1e-6, atol=1e-6)
    print(f"\n[torchrec] the page's KJT: max difference {np.abs(served - want).max():.2e}")


def test_kjts_of_many_samples_are_batched_and_equal_the_collection(server, recipe):
    ebc, features = recipe[0]["ebc"], recipe[0]["features"]
    rng = np.random.default_rng(65)
    kjts = [random_kjt(rng, int(rng.integers(1, 41))) for _ in range(30)]
    before = server.stats("ebc")
    results = fire_grpc(server, "ebc", None, [kjt_inputs(k, features) for k in kjts])
    after = server.stats_after("ebc", before, len(kjts))
    worst = 0.0
    for kjt, (got, err) in zip(kjts, results):
        assert err is None, str(err)
        want = expected(ebc, kjt)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        worst = max(worst, float(np.abs(got - want).max()))
    executions = after["execution_count"] - before["execution_count"]
    samples = sum(k.stride() for k in kjts)
    print(f"\n[torchrec] {len(kjts)} KJTs of 1-40 samples ({samples} samples, "
          f"{sum(int((k.lengths() == 0).sum()) for k in kjts)} empty bags) in {executions} executions, "
          f"max difference {worst:.2e}")
    assert executions < len(kjts), "KJTs of different sizes were not batched together"


def test_a_bad_request_fails_alone_naming_its_input(server, recipe):
    ebc, features = recipe[0]["ebc"], recipe[0]["features"]
    rng = np.random.default_rng(66)
    # no empty bags: request 6's ids of 4999 then fall in 'user' (1000 rows) too
    kjts = [random_kjt(rng, int(rng.integers(2, 9)), empty_share=0.0) for _ in range(8)]
    payloads = [kjt_inputs(k, features) for k in kjts]
    bad = {
        1: ({"KEYS": payloads[1]["KEYS"], "LENGTHS": payloads[1]["LENGTHS"][:, :-1]}, "not a whole"),
        3: ({"KEYS": payloads[3]["KEYS"], "LENGTHS": -payloads[3]["LENGTHS"] - 1}, "negative length"),
        5: ({"KEYS": payloads[5]["KEYS"][:, 1:], "LENGTHS": payloads[5]["LENGTHS"]}, "keys were sent"),
        6: ({"KEYS": np.full_like(payloads[6]["KEYS"], 4999), "LENGTHS": payloads[6]["LENGTHS"]},
            "out of range"),
    }
    for i, (p, _) in bad.items():
        payloads[i] = p
    results = fire_grpc(server, "ebc", None, payloads)
    for i, (got, err) in enumerate(results):
        if i in bad:
            assert err is not None, f"request {i} was answered"
            msg = str(err)
            name = "KEYS" if i == 6 else "LENGTHS"
            assert f"input '{name}'" in msg and bad[i][1] in msg, msg
        else:
            assert err is None, str(err)
            np.testing.assert_allclose(got, expected(ebc, kjts[i]), rtol=1e-6, atol=1e-6)


def test_what_a_sample_costs_whole_or_one_a_request(server, recipe):
    """The same 512 samples as one KJT and as 512 one-sample KJTs sent at once (printed)."""
    ebc, features = recipe[0]["ebc"], recipe[0]["features"]
    rng = np.random.default_rng(67)
    whole = random_kjt(rng, 512, empty_share=0.0)
    per_sample = []
    lengths = whole.lengths().numpy().reshape(3, 512)
    offsets = np.concatenate(([0], np.cumsum(whole.lengths().numpy())))
    values = whole.values().numpy()
    for s in range(512):
        ids = [values[offsets[f * 512 + s]:offsets[f * 512 + s + 1]] for f in range(3)]
        per_sample.append({"KEYS": np.concatenate(ids).astype(np.int64).reshape(1, -1),
                           "LENGTHS": lengths[:, s].astype(np.int32).reshape(1, -1)})
    one = kjt_inputs(whole, features)
    fire_grpc(server, "ebc", None, [one] * 4)  # warm
    timings = {}
    for name, payloads in (("one request of 512 samples", [one]), ("512 requests of 1 sample", per_sample)):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            results = fire_grpc(server, "ebc", None, payloads)
            best = min(best, time.perf_counter() - t0)
            assert all(err is None for _, err in results)
        timings[name] = best
    got = np.concatenate([r for r, _ in fire_grpc(server, "ebc", None, per_sample)])
    np.testing.assert_allclose(got, expected(ebc, whole), rtol=1e-6, atol=1e-6)
    a, b = timings.values()
    print(f"\n[torchrec] one request of 512 samples: {a * 1e3:.1f} ms ({a / 512 * 1e6:.1f} us per sample); "
          f"512 requests of 1 sample sent at once (gRPC): {b * 1e3:.1f} ms ({b / 512 * 1e6:.1f} us per sample), "
          f"{b / a:.0f}x")
