"""examples/triton_kernels.py: DLRM's interaction and DCNv2's cross layer as Triton kernels,
run by Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, in a process of its own: the
setting is read when Triton is imported), equal the same functions in plain torch; the models'
``triton`` forms equal their torch forms wherever the kernels are not used (CPU, TorchScript)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PY = os.path.join(ROOT, ".venv", "bin", "python")
PY = PY if os.path.exists(PY) else sys.executable

KERNEL = r"""
import os
import sys
sys.path.insert(0, "examples")
import torch
import triton_kernels as di

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

# x0 = [head | tail]: head widths that end inside a tile and on its edge; x None is the first layer
for batch, n, d0, rank, config, first in ((5, 200, 40, 64, None, False), (130, 136, 32, 128, "32x32x32w4s2", True),
                                          (70, 100, 16, 64, "32x64x32w4s2g2e", False),
                                          (9, 96, 32, 32, "32x32x32w4s2e", True)):
    if config:
        os.environ["TRITON_RUST_CROSS"] = config
    head, tail = torch.randn(batch, d0).half(), torch.randn(batch, n - d0).half()
    x = None if first else torch.randn(batch, n).half()
    h, w, b = torch.randn(batch, rank).half(), (torch.randn(n, rank) / rank ** 0.5).half(), torch.randn(n).half()
    got = di.cross_layer(head, tail, x, h, w, b)
    want = di.cross_reference(head.float(), tail.float(), None if first else x.float(), h.float(), w.float(), b.float())
    assert got.shape == (batch, n) and got.dtype == torch.float16
    step = torch.finfo(torch.float16).eps * want.abs().clamp(min=1.0)
    err = (got.float() - want).abs()
    assert bool((err <= step).all()), float((err / step).max())
    print("cross", batch, n, rank, first, float(err.max()))
"""


def test_kernel_equals_torch_in_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([PY, "-c", KERNEL], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "refused: dot_interaction: 40 tables" in p.stdout
    assert p.stdout.count("cross ") == 4


def test_triton_forms_equal_torch_off_the_gpu():
    pytest.importorskip("triton")
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    import recommenders

    dense, emb = torch.randn(6, 13), torch.randn(6, 26, 128) * 0.05
    for name, option, plain in (("dlrm", "interaction", "split"), ("dcnv2", "cross", "torch")):
        nets = {form: recommenders.DensePart(recommenders.make(name, [1] * 26, **{option: form}))
                for form in (plain, "triton")}
        with torch.no_grad():
            want = nets[plain](dense, emb)
            assert torch.equal(nets["triton"](dense, emb), want)
            assert torch.equal(torch.jit.script(nets["triton"])(dense, emb), want)


def test_cross_config_is_read_and_checked():
    pytest.importorskip("triton")
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import triton_kernels

    assert triton_kernels.cross_config("64x128x32w4s4") == (64, 128, 32, 4, 4, 8, False)
    assert triton_kernels.cross_config("64x128x32w4s4e") == (64, 128, 32, 4, 4, 8, True)
    assert triton_kernels.cross_config("64x128x32w4s4g16e") == (64, 128, 32, 4, 4, 16, True)
    assert triton_kernels.cross_config() == triton_kernels.cross_config(triton_kernels.CROSS_DEFAULT)
    for bad in ("128x64", "128x64x64w8", "100x64x64w8s3", "128x64x64w8s3p", "128x64x64w8s3g0", "128x64x64w8s3eg4"):
        with pytest.raises(ValueError):
            triton_kernels.cross_config(bad)
