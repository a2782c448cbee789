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

# the FP8 layer: x' in fp16 (or not written) and quantized to e4m3 for the next layer
E4M3 = torch.float8_e4m3fn
for batch, n, d0, rank, config, first, write in ((5, 200, 40, 64, "32x32x32w4s2", False, True),
                                                 (130, 136, 32, 128, "32x32x32w4s2", True, True),
                                                 (70, 100, 16, 64, "32x64x32w4s2g2e", False, False)):
    os.environ["TRITON_RUST_CROSS_FP8"] = config
    head, tail = torch.randn(batch, d0).half(), torch.randn(batch, n - d0).half()
    x = None if first else torch.randn(batch, n).half()
    hq = (torch.randn(batch, rank) * 50).clamp(-448, 448).to(E4M3)
    w = (torch.randn(n, rank) * 100).clamp(-448, 448).to(E4M3)
    scales, b = torch.tensor([1e-2, 1e-2, 30.0]), torch.randn(n).half()
    got16, gotq = di.cross_layer_fp8(head, tail, x, hq, w, scales, b, write)
    want16, wantq = di.cross_fp8_reference(head, tail, x, hq, w, scales, b, write)
    assert got16.shape == ((batch if write else 0), n) and got16.dtype == torch.float16
    assert gotq.shape == (batch, n) and gotq.dtype == E4M3
    if write:  # both from the same FP32 value, one fp16 rounding
        assert torch.equal(got16, want16), float((got16.float() - want16.float()).abs().max())
    g, wq = gotq.float(), wantq.float()
    # the interpreter's float -> e4m3 conversion drops the carry when rounding up reaches the next
    # power of two (it gives half of it), and rounds subnormals (below 2^-6) by up to one step
    # (2^-9); the GPU converts in hardware (cross_sweep.py --fp8 compares its outputs)
    carry = (g != wq) & (wq.abs() == 2.0 ** torch.log2(wq.abs()).round()) & (g == wq / 2)
    subnormal = (wq.abs() <= 2.0 ** -6) & ((g - wq).abs() <= 2.0 ** -9)
    ok = (g == wq) | carry | subnormal
    assert bool(ok.all()), (g[~ok][:5], wq[~ok][:5])
    assert float((g == wq).float().mean()) > 0.9
    print("cross fp8", batch, n, rank, first, write)
"""


def test_kernel_equals_torch_in_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([PY, "-c", KERNEL], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "refused: dot_interaction: 40 tables" in p.stdout
    assert p.stdout.count("cross ") == 7 and p.stdout.count("cross fp8 ") == 3


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


def test_fp8_kernel_network_equals_its_layers_as_written():
    """DCNv2 with FP8 layers: the kernels' form (each layer's second product and the rest in
    cross_layer_fp8, the next product reading its e4m3 output) computes what the FP8 layers do
    one after the other. On CPU in FP32 the kernel's stand-in is the same arithmetic, so the two
    agree exactly; the GPU's kernel is compared by dlrm_v2_network.py and cross_sweep.py --fp8."""
    pytest.importorskip("triton")
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    import fp8
    import recommenders

    torch.manual_seed(0)
    part = recommenders.DensePart(recommenders.make("dcnv2", [1] * 26, cross="triton")).eval()
    dense, emb = torch.rand(64, 13), torch.randn(64, 26, 128) * 0.05
    fp8.to_fp8(part, lambda m: m(dense, emb))
    model = part.model
    assert model.fp8_layers()
    with torch.no_grad():
        bottom = model.bottom(model.padded_dense(dense))
        got = torch.sigmoid(model.fp8_kernel_net(bottom, emb.flatten(1)))
        want = part(dense, emb)  # on CPU: the layers as written, each FP8 layer quantizing its input
    assert got.shape == want.shape == (64, 1)
    assert torch.equal(got, want), float((got - want).abs().max())
    assert float(want.std()) > 1e-3  # the predictions vary: the comparison says something
