"""examples/dot_interaction.py: the DLRM interaction kernel, run by Triton's interpreter on
CPU tensors (TRITON_INTERPRET=1, in a process of its own: the setting is read when Triton is
imported), equals the interaction in plain torch, and DLRM's ``triton`` form equals ``split``
wherever the kernel is not used (CPU, TorchScript)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PY = os.path.join(ROOT, ".venv", "bin", "python")
PY = PY if os.path.exists(PY) else sys.executable

KERNEL = r"""
import sys
sys.path.insert(0, "examples")
import torch
import dot_interaction as di

torch.manual_seed(0)
for batch, tables, width in ((1, 26, 480), (5, 26, 480), (4, 26, 488), (3, 7, 160)):
    x = torch.randn(batch, 128).half()
    emb = torch.randn(batch, tables, 128).half()
    got = di.dot_interaction(x, emb, width)
    want = di.reference(x.float(), emb.float(), width)
    assert got.shape == (batch, width) and got.dtype == torch.float16, (got.shape, got.dtype)
    # FP32 accumulation, one FP16 rounding: within half an FP16 step of the exact value
    step = torch.finfo(torch.float16).eps * want.abs().clamp(min=1.0)
    err = (got.float() - want).abs()
    assert bool((err <= step).all()), float((err / step).max())
    assert bool((got[:, 128 + (tables + 1) * tables // 2:] == 0).all())
    print(batch, tables, width, float(err.max()))
try:
    di.dot_interaction(torch.zeros(1, 128).half(), torch.zeros(1, 40, 128).half(), 1000)
except ValueError as e:
    print("refused:", e)
else:
    raise SystemExit("40 tables were not refused")
"""


def test_kernel_equals_torch_in_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([PY, "-c", KERNEL], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "refused: dot_interaction: 40 tables" in p.stdout


def test_triton_form_is_split_off_the_gpu():
    pytest.importorskip("triton")
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    import recommenders

    nets = {form: recommenders.DensePart(recommenders.make("dlrm", [1] * 26, interaction=form)) for form in ("split", "triton")}
    dense, emb = torch.randn(6, 13), torch.randn(6, 26, 128) * 0.05
    with torch.no_grad():
        want = nets["split"](dense, emb)
        assert torch.equal(nets["triton"](dense, emb), want)
        assert torch.equal(torch.jit.script(nets["triton"])(dense, emb), want)
