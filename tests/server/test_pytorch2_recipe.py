"""docs/pytorch2.md's "Your own model, step by step", run as written, and what it promises.

The section's Python blocks run in an empty folder (one namespace, in order); the config block
is saved where the line before it says. The package has no metadata of ours: the config lists
its tensors. Then, through the real tritonserver:

- requests within the exported ranges, merged by the batcher, equal the eager module;
- a sequence of 600 and one of 4096 tokens (the exported range is 8..128, the position table
  512) are refused with a 400 naming the input and the dimension, while the requests sent with
  them are answered, and the server goes on serving (without the check the first is answered
  with a wrong answer and the second ends the process inside the compiled CPU kernel);
- the same package without batching (`max_batch_size: 0`) checks the batch dimension too;
- a package exported with a fixed batch of 1 (plain torch.export, no metadata) is refused at
  load under `max_batch_size: 8`, naming the input, and loads under `max_batch_size: 0`.
"""
from __future__ import annotations

import os
import re
import shutil
import threading

import numpy as np
import pytest
import torch

from conftest import module_server
from tritonserver_harness import REPO_ROOT, ModelRepo, infer, make_client

DOC = os.path.join(REPO_ROOT, "docs", "pytorch2.md")
SECTION = "## Your own model, step by step"


def recipe_blocks() -> tuple[list[str], list[tuple[str, str]]]:
    """(python blocks, [(path, text) of the other blocks whose preceding text names a file])."""
    text = open(DOC).read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end > 0 else len(text)]
    python, files = [], []
    for m in re.finditer(r"```(\w*)\n(.*?)```", section, re.S):
        lang, body = m.group(1), m.group(2)
        if lang == "python":
            python.append(body)
        elif lang == "":
            before = section[:m.start()].rstrip().splitlines()[-1]
            named = re.findall(r"`([\w./-]+/config\.pbtxt)`", before)
            assert named, f"a config block in {SECTION!r} follows no `.../config.pbtxt`: {before!r}"
            files.append((named[-1], body))
    return python, files


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """The section run as written in an empty folder: its namespace and the folder."""
    work = str(tmp_path_factory.mktemp("recipe"))
    python, files = recipe_blocks()
    assert python and files, "the recipe lost its code blocks"
    cwd = os.getcwd()
    os.chdir(work)
    try:
        space: dict = {"__name__": "recipe"}
        for block in python:
            exec(compile(block, DOC, "exec"), space)  # noqa: S102 - the page's own code, as a user runs it
        for path, body in files:
            with open(path, "w") as f:
                f.write(body)
    finally:
        os.chdir(cwd)
    return space, work


@pytest.fixture(scope="module")
def fixed_batch_package(tmp_path_factory):
    """Plain torch.export of a batch of exactly 1, no metadata: what a user gets by leaving out
    dynamic_shapes (about 30 s)."""
    path = str(tmp_path_factory.mktemp("fixed") / "model.pt2")
    torch.manual_seed(1)
    lin = torch.nn.Linear(16, 10).eval()
    with torch.no_grad():
        ep = torch.export.export(lin, (torch.randn(1, 16),))
        torch._inductor.aoti_compile_and_package(ep, package_path=path)
    return path


FIXED_CONFIG = """name: "{name}"
backend: "rust"
platform: "torch_aoti"
max_batch_size: {mbs}
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {out} ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
"""


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, recipe, fixed_batch_package):
    _, work = recipe
    repo = ModelRepo(os.path.join(work, "repo"))
    # the recipe's package again, without batching: every dimension is the request's own
    os.makedirs(os.path.join(repo.root, "tiny_bert_nobatch", "1"))
    shutil.copy(os.path.join(repo.root, "tiny_bert", "1", "model.pt2"),
                os.path.join(repo.root, "tiny_bert_nobatch", "1", "model.pt2"))
    with open(os.path.join(repo.root, "tiny_bert", "config.pbtxt")) as f:
        config = f.read()
    repo.write_config("tiny_bert_nobatch", config.replace('name: "tiny_bert"', 'name: "tiny_bert_nobatch"')
                      .replace("max_batch_size: 8", "max_batch_size: 0").replace("dynamic_batching { }\n", "")
                      .replace("dims: [ -1 ] }", "dims: [ -1, -1 ] }").replace("dims: [ -1, 2 ]", "dims: [ -1, -1, 2 ]"))
    for name, mbs, dims, out in (("fixed_batched", 8, "16", "10"), ("fixed_unbatched", 0, "1, 16", "1, 10")):
        os.makedirs(os.path.join(repo.root, name, "1"))
        shutil.copy(fixed_batch_package, os.path.join(repo.root, name, "1", "model.pt2"))
        repo.write_config(name, FIXED_CONFIG.format(name=name, mbs=mbs, dims=dims, out=out))
    return module_server(request, tmp_path_factory, repo, "--model-control-mode=explicit",
                         "--load-model=tiny_bert", "--load-model=tiny_bert_nobatch")


def eager(recipe, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return recipe[0]["model"](torch.from_numpy(ids)).numpy()


def send_at_once(server, model: str, requests: list[np.ndarray]) -> list:
    answers: list = [None] * len(requests)
    start = threading.Barrier(len(requests))

    def one(i):
        client = make_client(server, "grpc")
        start.wait()
        try:
            answers[i] = infer(client, "grpc", model, {"INPUT__0": requests[i]}, ["OUTPUT__0"])["OUTPUT__0"]
        except Exception as e:  # noqa: BLE001 - refusals are what is checked
            answers[i] = e
        client.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_the_recipe_serves_equal_to_eager(server, recipe):
    rng = np.random.default_rng(3)
    requests = [rng.integers(0, 1000, (b, 40), dtype=np.int64) for b in (1, 2, 3, 1, 1)]
    before = server.stats("tiny_bert")
    answers = send_at_once(server, "tiny_bert", requests)
    after = server.stats_after("tiny_bert", before, len(requests))
    worst = 0.0
    for ids, got in zip(requests, answers):
        assert not isinstance(got, Exception), got
        assert got.shape == (len(ids), 40, 2)
        worst = max(worst, float(np.abs(got - eager(recipe, ids)).max()))
    runs = int(after["execution_count"]) - int(before["execution_count"])
    print(f"\n[recipe] tiny_bert: {len(requests)} requests in {runs} runs, max |served - eager| {worst:.2g}")
    assert worst <= 1e-5


@pytest.mark.parametrize("length", [600, 4096])
def test_a_sequence_past_the_export_is_refused_and_the_server_goes_on(server, recipe, length):
    rng = np.random.default_rng(length)
    good = [rng.integers(0, 1000, (1, 24), dtype=np.int64) for _ in range(3)]
    bad = rng.integers(0, 1000, (1, length), dtype=np.int64)
    answers = send_at_once(server, "tiny_bert", [good[0], bad, good[1], good[2]])
    refusal = answers[1]
    print(f"\n[recipe] a sequence of {length}: {refusal}")
    assert isinstance(refusal, Exception), f"a sequence of {length} was answered"
    assert "StatusCode.INVALID_ARGUMENT" in str(refusal.status()), refusal.status()
    assert f"input 'INPUT__0' has size {length} in dimension 1" in str(refusal), refusal
    assert "exported for 8 to 128" in str(refusal), refusal
    for ids, got in zip(good, (answers[0], answers[2], answers[3])):
        assert not isinstance(got, Exception), got
        assert float(np.abs(got - eager(recipe, ids)).max()) <= 1e-5
    assert server.alive()
    # and every model goes on answering
    ids = rng.integers(0, 1000, (2, 128), dtype=np.int64)
    got = infer(make_client(server, "http"), "http", "tiny_bert_nobatch", {"INPUT__0": ids}, ["OUTPUT__0"])
    assert float(np.abs(got["OUTPUT__0"] - eager(recipe, ids)).max()) <= 1e-5


def test_without_batching_the_batch_dimension_is_checked_too(server):
    client = make_client(server, "http")
    ids = np.zeros((9, 16), dtype=np.int64)
    with pytest.raises(Exception) as e:
        infer(client, "http", "tiny_bert_nobatch", {"INPUT__0": ids}, ["OUTPUT__0"])
    print(f"\n[recipe] tiny_bert_nobatch, 9 sequences: {e.value}")
    assert "has size 9 in dimension 0" in str(e.value) and "1 to 8" in str(e.value)
    with pytest.raises(Exception) as e:
        infer(client, "http", "tiny_bert_nobatch", {"INPUT__0": np.zeros((1, 7), np.int64)}, ["OUTPUT__0"])
    assert "has size 7 in dimension 1" in str(e.value)
    assert server.alive()


def test_a_fixed_batch_package_is_refused_under_batching(server, fixed_batch_package):
    r = server.load("fixed_batched")
    msg = r.json().get("error", r.text)
    print(f"\n[recipe] fixed_batched: {r.status_code} {msg}")
    assert r.status_code == 400, msg
    assert "input 'INPUT__0' was exported with a fixed first dimension of 1" in msg, msg
    assert "max_batch_size: 0" in msg
    assert not server.model_ready("fixed_batched")
    r = server.load("fixed_unbatched")
    assert r.status_code == 200, r.text
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    got = infer(make_client(server, "http"), "http", "fixed_unbatched", {"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    torch.manual_seed(1)
    want = torch.nn.Linear(16, 10).eval()(torch.from_numpy(x)).detach().numpy()
    assert float(np.abs(got - want).max()) <= 1e-5
