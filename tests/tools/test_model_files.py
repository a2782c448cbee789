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
