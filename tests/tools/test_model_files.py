"""examples/model_files.py: a model file is written only when the disk has room for it, and under
a temporary name first, so a full disk gives one clear message and never a half file that the
next export would take for a finished one."""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import model_files  # noqa: E402


def test_too_little_room_names_the_file_and_the_sizes(tmp_path):
    path = str(tmp_path / "m" / "1" / "model.pt")
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(SystemExit) as e:
        model_files.ensure_free_space(path, free + (1 << 30), "bert_large_pt")
    text = str(e.value)
    assert "bert_large_pt" in text and path in text and "MiB are free" in text, text
    assert not os.path.exists(path)


def test_room_enough_passes_and_makes_the_folder(tmp_path):
    path = str(tmp_path / "m" / "1" / "model.pt")
    model_files.ensure_free_space(path, 1 << 20, "small")
    assert os.path.isdir(os.path.dirname(path))


def test_a_torchscript_export_leaves_only_the_finished_file(tmp_path):
    import torch_models
    path = torch_models.export(str(tmp_path), "bert_small_pt")
    assert os.listdir(os.path.dirname(path)) == ["model.pt"]
    import torch
    torch.jit.load(path)  # whole: loads


def short_disk(monkeypatch, folder: str, free: int):
    """shutil.disk_usage reporting `free` bytes for paths under `folder`, the truth elsewhere."""
    real = shutil.disk_usage

    def usage(p):
        u = real(p)
        if os.path.abspath(p).startswith(os.path.abspath(folder)):
            return u._replace(free=free)
        return u
    monkeypatch.setattr(model_files.shutil, "disk_usage", usage)


def test_a_file_too_large_for_its_disk_goes_to_the_spill_folder_and_is_linked(tmp_path, monkeypatch):
    repo, spill = tmp_path / "repo", tmp_path / "spill"
    path = str(repo / "bert_large" / "1" / "model.onnx")
    short_disk(monkeypatch, str(repo), 10 << 20)
    monkeypatch.setenv(model_files.SPILL_ENV, str(spill))
    where = model_files.placed(path, 100 << 20, "ONNX model")
    assert where.startswith(str(spill)) and where.endswith(os.path.join("bert_large", "1", "model.onnx"))
    with open(model_files.tmp_path(where), "wb") as f:
        f.write(b"weights")
    model_files.finish(path, where)
    assert os.path.islink(path) and open(path, "rb").read() == b"weights"
    assert sorted(os.listdir(os.path.dirname(path))) == ["model.onnx"]  # no temporary left
    # the spilled file gone (the test command removes its folder at exit): no file, written again
    os.remove(where)
    assert not os.path.exists(path)
    # room for the file but not for the reserve the disk keeps: spilled too
    short_disk(monkeypatch, str(repo), (100 << 20) + model_files.SPILL_RESERVE - 1)
    assert model_files.placed(path, 100 << 20, "ONNX model") == where
    short_disk(monkeypatch, str(repo), (100 << 20) + model_files.SPILL_RESERVE)
    assert model_files.placed(path, 100 << 20, "ONNX model") == path
    monkeypatch.undo()
    again = model_files.placed(path, 1 << 20, "ONNX model")
    assert again == path
    with open(model_files.tmp_path(again), "wb") as f:
        f.write(b"new")
    model_files.finish(path, again)
    assert not os.path.islink(path) and open(path, "rb").read() == b"new"


def test_no_spill_folder_or_no_room_there_is_the_disks_message(tmp_path, monkeypatch):
    repo, spill = tmp_path / "repo", tmp_path / "spill"
    path = str(repo / "m" / "1" / "model.pt")
    short_disk(monkeypatch, str(repo), 10 << 20)
    monkeypatch.delenv(model_files.SPILL_ENV, raising=False)
    with pytest.raises(SystemExit) as e:
        model_files.placed(path, 100 << 20, "bert_large_pt")
    assert "bert_large_pt" in str(e.value) and "MiB are free" in str(e.value)
    short_disk(monkeypatch, str(tmp_path), 10 << 20)  # the spill folder short too
    monkeypatch.setenv(model_files.SPILL_ENV, str(spill))
    with pytest.raises(SystemExit) as e:
        model_files.placed(path, 100 << 20, "bert_large_pt")
    assert path in str(e.value)
