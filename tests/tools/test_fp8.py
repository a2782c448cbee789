"""examples/fp8.py on the CPU (torch._scaled_mm's per-tensor path): an FP8 layer computes the
product of its quantized input and weight exactly as dequantized, saturates past its calibrated
range, and converting DLRM-v2's network picks its large layers and keeps its predictions close
to the FP32 network's (bench/gpu/results/dlrm-v2-network measures the same on an H100)."""
import os
import sys

import pytest
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import dlrm_v2  # noqa: E402
import fp8  # noqa: E402
import recommenders  # noqa: E402


def dequantized(layer: fp8.Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    """The layer's product written out: the input quantized with its scale, times the FP8
    weight, both dequantized, in float64."""
    q = (x.double() * float(layer.inv_scale_x)).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX).float().to(fp8.FP8)
    xq = q.double() * float(layer.scale_x)
    w = layer.weight.double() * float(layer.scale_w)
    return xq @ w.t() + layer.bias.double()


def test_a_layer_is_its_dequantized_product():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    x = torch.randn(48, 64)
    layer = fp8.Fp8Linear(lin, float(x.abs().max()))
    got = layer(x).double()
    want = dequantized(layer, x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    # and close to the FP32 layer: e4m3 keeps 3 bits of mantissa
    exact = lin(x).double()
    assert (got - exact).abs().max() < 0.1 * exact.abs().max()


def test_inputs_past_the_calibrated_range_saturate():
    torch.manual_seed(1)
    lin = nn.Linear(16, 16, bias=False)
    layer = fp8.Fp8Linear(lin, input_amax=1.0)
    x = torch.full((2, 16), 5.0)
    # 5.0 reads as 1.0, the calibrated largest magnitude (no overflow to NaN)
    assert torch.allclose(layer(x), layer(torch.ones(2, 16)))
    assert torch.isfinite(layer(x * 1e6)).all()


def test_widths_and_calibration_are_checked():
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8.Fp8Linear(nn.Linear(20, 32), 1.0)
    with pytest.raises(ValueError, match="never nonzero"):
        fp8.Fp8Linear(nn.Linear(32, 32), 0.0)
    with pytest.raises(ValueError, match="no linear layer"):
        fp8.to_fp8(nn.Sequential(nn.Linear(16, 8)), lambda m: m(torch.ones(1, 16)))


def test_dlrm_v2_network_in_fp8():
    net = recommenders.DensePart(recommenders.make("dcnv2", [1] * recommenders.NUM_TABLES)).eval()
    ref = recommenders.DensePart(recommenders.make("dcnv2", [1] * recommenders.NUM_TABLES)).eval()
    calib = dlrm_v2.calibration_inputs(512, seed=0)
    with torch.no_grad():
        amax = fp8.to_fp8(net, lambda m: m(*calib))
        # the cross layers' two products and the deep MLP's 3456-1024-1024-512-256, the bottom MLP's 512->256
        assert sorted(amax) == sorted(["model.bottom.2", *(f"model.v.{i}" for i in range(3)),
                                       *(f"model.u.{i}" for i in range(3)),
                                       *(f"model.deep.{i}" for i in (0, 2, 4, 6))])
        assert all(v > 0 for v in amax.values())
        assert isinstance(net.model.deep[8], nn.Linear)  # 256 -> 1 stays as it was
        dense, emb = dlrm_v2.calibration_inputs(256, seed=1)
        got, want = net(dense, emb), ref(dense, emb)
    diff = (got - want).abs()
    corr = torch.corrcoef(torch.stack([got.flatten(), want.flatten()]))[0, 1]
    # the H100 run measured max 1.8e-2, Pearson 0.990 at batch 8192
    assert diff.max() < 5e-2 and corr > 0.97, (float(diff.max()), float(corr))
