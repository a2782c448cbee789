"""FP8 (e4m3) linear layers for the recommenders' networks, the H100's fastest tensor-core type.

``to_fp8(module, calibrate)`` replaces a module's large ``nn.Linear`` layers (both widths at least
``min_width`` and multiples of 16, which FP8 GEMMs require) by ``Fp8Linear``: the weight stored in
float8 e4m3 with one scale per tensor (its largest magnitude maps to e4m3's 448), the input
quantized on the way in with one static scale per layer, taken from the largest magnitude the
layer's input reached while ``calibrate`` ran the module (TensorRT's max calibration; a value past
it saturates at 448 instead of overflowing). The product runs in ``torch._scaled_mm`` (cuBLASLt's
FP8 GEMM on a GPU; a reference implementation on CPU) with FP32 accumulation, bias added, and the
layer's output in the input's type (fp16 behind ``HalfDense``). Small layers (the bottom MLP's
first, the last 256 -> 1) stay in the module's type: they hold a fraction of a percent of the
FLOPs and take the raw dense features or give the logit.

Per-tensor scales on both sides keep the scales scalar, so the quantization fuses into the
previous layer's pointwise work under Inductor and the GEMM needs no per-row scale tensors.
Exactness is stated per model against its FP32 network (bench/gpu/dlrm_v2_network.py).
"""
from __future__ import annotations

from typing import Callable, Dict, List

import torch
from torch import nn

E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn


class Fp8Linear(nn.Module):
    """``y = x W^T + b`` with ``x`` and ``W`` in float8 e4m3, accumulated in FP32 and written in
    ``x``'s type. ``rows=False``: one scale per tensor, ``x``'s static (calibrated); ``rows=True``:
    one scale per output channel of ``W`` and one per row of ``x``, taken from the row as it comes
    (more exact, one more reduction per layer; cuBLASLt's row-wise FP8 GEMM, GPU only)."""

    def __init__(self, linear: nn.Linear, input_amax: float, rows: bool = False):
        super().__init__()
        self.rows = rows
        if linear.in_features % 16 or linear.out_features % 16:
            raise ValueError(f"an FP8 GEMM needs widths that are multiples of 16, not "
                             f"{linear.in_features} -> {linear.out_features}")
        if not input_amax > 0.0:
            raise ValueError(f"the layer's input was never nonzero while calibrating (amax {input_amax})")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        if rows:
            w_amax = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)  # [out, 1]
            self.register_buffer("weight", (w * (E4M3_MAX / w_amax)).to(FP8))  # [out, in], row-major
            self.register_buffer("scale_w", (w_amax / E4M3_MAX).t().contiguous())  # [1, out]
        else:
            w_amax = w.abs().max().clamp(min=1e-12)
            self.register_buffer("weight", (w * (E4M3_MAX / w_amax)).to(FP8))
            self.register_buffer("scale_w", (w_amax / E4M3_MAX).reshape(()))
        self.register_buffer("scale_x", torch.tensor(input_amax / E4M3_MAX, dtype=torch.float32))
        self.register_buffer("inv_scale_x", torch.tensor(E4M3_MAX / input_amax, dtype=torch.float32))
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features)
        if self.rows:
            scale_x = flat.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX  # [M, 1]
            q = (flat.float() / scale_x).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
            # cuBLASLt's row-wise FP8 GEMM writes bf16: the bias is added after, in FP32
            y = torch._scaled_mm(q, self.weight.t(), scale_a=scale_x, scale_b=self.scale_w,
                                 out_dtype=torch.bfloat16).float()
            if self.bias is not None:
                y = y + self.bias.float()
            return y.to(x.dtype).reshape(*lead, self.out_features)
        return self.product(self.quantize(flat), x.dtype).reshape(*lead, self.out_features)

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in e4m3 with the layer's static input scale (per-tensor layers), saturated at 448."""
        return quantize(x, self.inv_scale_x)

    def product(self, q: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """The layer on an input already quantized with its scale (``quantize``; per-tensor
        layers): ``q`` [M, in] e4m3 -> [M, out] in ``out_dtype``, bias added."""
        bias = None if self.bias is None else self.bias.to(out_dtype)
        # cuBLASLt wants the second operand column-major: the row-major [out, in] weight, transposed
        return torch._scaled_mm(q, self.weight.t(), scale_a=self.scale_x, scale_b=self.scale_w, bias=bias,
                                out_dtype=out_dtype)

    def extra_repr(self) -> str:
        scales = "per row and channel" if self.rows else f"per tensor, input amax {float(self.scale_x) * E4M3_MAX:.4g}"
        return f"{self.in_features} -> {self.out_features}, e4m3, {scales}"


def quantize(x: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """``x * inv_scale`` in e4m3, saturated at 448 (a value past the calibrated range reads as
    the range's end instead of overflowing)."""
    return (x.float() * inv_scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


def fp8_candidates(module: nn.Module, min_width: int = 256) -> List[str]:
    """Names of the linear layers ``to_fp8`` converts: both widths >= ``min_width``, multiples of 16."""
    return [name for name, m in module.named_modules()
            if isinstance(m, nn.Linear) and min(m.in_features, m.out_features) >= min_width
            and m.in_features % 16 == 0 and m.out_features % 16 == 0]


@torch.no_grad()
def input_amax(module: nn.Module, names: List[str], calibrate: Callable[[nn.Module], None]) -> Dict[str, float]:
    """The largest magnitude each named layer's input reached while ``calibrate(module)`` ran."""
    seen: Dict[str, float] = {n: 0.0 for n in names}
    hooks = []
    for name, m in module.named_modules():
        if name in seen:
            def hook(_m, args, _name=name):
                seen[_name] = max(seen[_name], float(args[0].detach().abs().max()))
            hooks.append(m.register_forward_pre_hook(hook))
    try:
        calibrate(module)
    finally:
        for h in hooks:
            h.remove()
    return seen


def to_fp8(module: nn.Module, calibrate: Callable[[nn.Module], None], min_width: int = 256,
           rows: bool = False) -> Dict[str, float]:
    """Replaces ``module``'s large linear layers by ``Fp8Linear`` (in place; ``rows``: its per-row
    scales), the input scales from ``calibrate``; returns each converted layer's calibrated input amax."""
    names = fp8_candidates(module, min_width)
    if not names:
        raise ValueError("no linear layer of the module is large enough for FP8")
    amax = input_amax(module, names, calibrate)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        linear = getattr(parent, child)
        setattr(parent, child, Fp8Linear(linear, amax[name], rows).to(linear.weight.device))
    return amax
