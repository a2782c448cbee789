"""Recommender layers as Triton kernels, for CUDA AOTInductor packages.

Each is a ``torch.library.triton_op``: ``torch.export`` and AOTInductor see the kernel and
compile it into the package, so the served package needs no Python. On CPU tensors each is the
same function in plain torch (CPU packages, the tests' reference); ``TRITON_INTERPRET=1`` runs
the kernels themselves on CPU tensors (tests/tools/test_triton_kernels.py).

``dot_interaction`` (DLRM). The interaction takes the bottom MLP's output ``x`` [B, D] and the
26 embeddings ``emb`` [B, 26, D], forms the 27 vectors' pairwise dot products below the
diagonal (in ``torch.tril_indices(27, 27, -1)`` order, vector 0 being ``x``) and hands the top
MLP ``[x | pairs | zero padding]``. Written with ``torch.bmm`` (``recommenders.DLRM``'s ``cat``
and ``split`` forms), Inductor runs it as two batched products that read the embeddings twice
(cuBLAS picks WMMA kernels aligned to two elements for 65,536 products of 26 x 128 x 26), then
gathers the pairs and concatenates: on an H100 at batch 65536 about 0.7 ms of a 1.8 ms network
(git show 5acfa20:bench/gpu/results/aoti_h100_b/network_profile/console.log). The kernel reads each sample's 27 vectors once,
multiplies them on the tensor cores (one 32 x 128 x 32 product per sample, FP32 accumulation)
and writes the top MLP's input whole: 0.354 ms there (bench/gpu/results/network/dlrm_interaction).

``cross_layer`` (DCNv2). A cross layer is ``x0 * (h @ U.T + b) + x`` with ``h = x @ V.T`` of
rank 512. Inductor runs the product with cuBLAS and the rest as a separate pass that reads
``x0``, ``x`` and the product and writes the result, four [B, 3456] tensors: 0.58 ms against
0.39 ms for the product at batch 65536 on an H100 (network_profile). The kernel computes the
product tile by tile and applies the rest to each tile while it is in registers, so the
product is never written: 0.875 ms a layer there against 0.92 for the two (all three layers
2.62 ms, git show 5acfa20:bench/gpu/results/aoti_h100_d/network_dcnv2_cross/console.log). ``x0`` is the bottom MLP's output
beside the 26 embeddings; the kernel reads it from those two tensors, so that it is never
concatenated (a [B, 3456] tensor written and read again), and the first layer, where ``x`` is
``x0``, reads it once.

``cross_layer_fp8`` (DCNv2 with FP8 layers, examples/fp8.py). The same layer with its second
product on FP8 operands (``h`` quantized, ``U`` the Fp8Linear's weight, per-tensor scales): the
tile's FP32 product is scaled, biased and combined with ``x0`` and ``x`` in registers, and the
result is written twice: in fp16 (the next layer's ``x``; not at all after the last layer) and
quantized to e4m3 with the next FP8 layer's input scale (what that layer's product reads). So
neither the product nor a separate quantization pass goes through memory: per element of
[B, 3456] a layer reads x0 and x and writes 3 bytes, where the unfused layer also writes and
reads the product and reads x again to quantize it.
"""
import os
import re
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

# Triton's dot needs each side at least 16 wide: the 27 vectors are padded to 32 rows
ROWS = 32


@triton.jit
def _dot_interaction_kernel(x_ptr, emb_ptr, out_ptr, TABLES: tl.constexpr, DIM: tl.constexpr, WIDTH: tl.constexpr,
                            PAIRS: tl.constexpr, PAD: tl.constexpr, ROWS_: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, ROWS_)[:, None]
    c = tl.arange(0, DIM)[None, :]
    # row 0 is x, rows 1..TABLES the embeddings, the rest zero
    e = tl.load(emb_ptr + b * TABLES * DIM + (r - 1) * DIM + c, mask=(r >= 1) & (r <= TABLES), other=0.0)
    x = tl.load(x_ptr + b * DIM + c + r * 0, mask=r == 0, other=0.0)
    t = e + x
    g = tl.dot(t, tl.trans(t))  # [ROWS, ROWS], FP32 accumulation
    i = tl.arange(0, ROWS_)[:, None]
    j = tl.arange(0, ROWS_)[None, :]
    out = out_ptr + b * WIDTH
    tl.store(out + DIM + i * (i - 1) // 2 + j, g.to(out_ptr.dtype.element_ty), mask=(j < i) & (i <= TABLES))
    d = tl.arange(0, DIM)
    tl.store(out + d, tl.load(x_ptr + b * DIM + d))
    if PAD > 0:
        p = tl.arange(0, 16)
        tl.store(out + DIM + PAIRS + p, tl.zeros([16], dtype=out_ptr.dtype.element_ty), mask=p < PAD)


def reference(x: torch.Tensor, emb: torch.Tensor, width: int) -> torch.Tensor:
    """The same function in plain torch: [x | the pairs | zeros up to `width`]."""
    n = emb.shape[1] + 1
    li, lj = torch.tril_indices(n, n, offset=-1, device=emb.device)
    t = torch.cat([x.unsqueeze(1), emb], dim=1)
    pairs = torch.bmm(t, t.transpose(1, 2))[:, li, lj]
    out = torch.cat([x, pairs], dim=1)
    return torch.nn.functional.pad(out, (0, width - out.shape[1]))


def _interpreted(t: torch.Tensor) -> bool:
    """Whether the kernel runs: on CUDA tensors, or anywhere under Triton's interpreter."""
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def _launcher(kernel):
    # the interpreter's kernels are not JIT functions, which wrap_triton (for tracing) requires
    return kernel if os.environ.get("TRITON_INTERPRET") == "1" else wrap_triton(kernel)


@triton_op("triton_rust::dot_interaction", mutates_args={})
def dot_interaction(x: torch.Tensor, emb: torch.Tensor, width: int) -> torch.Tensor:
    """[x | pairwise dot products of (x, emb's rows) below the diagonal | zeros] as [B, width]."""
    batch, tables, dim = emb.shape
    pairs = (tables + 1) * tables // 2
    if tables + 1 > ROWS or dim % 16 or dim & (dim - 1) or not 0 <= width - dim - pairs <= 16:
        raise ValueError(f"dot_interaction: {tables} tables of dim {dim} into width {width} is not supported")
    if not _interpreted(emb):
        return reference(x, emb, width)
    x = x.contiguous()
    emb = emb.contiguous()
    out = torch.empty((batch, width), dtype=emb.dtype, device=emb.device)
    _launcher(_dot_interaction_kernel)[(batch,)](x, emb, out, TABLES=tables, DIM=dim, WIDTH=width, PAIRS=pairs,
                     PAD=width - dim - pairs, ROWS_=ROWS, num_warps=4)
    return out


@triton.jit
def _cross_layer_inputs(head_at, tail_at, x_at, in_head, in_tail, inside, FIRST: tl.constexpr):
    """A tile's x0 (its columns from head or tail) and x (x0 itself in the first layer)."""
    x0 = tl.load(head_at, mask=in_head, other=0.0) + tl.load(tail_at, mask=in_tail, other=0.0)
    if FIRST:
        x = x0
    else:
        x = tl.load(x_at, mask=inside, other=0.0)
    return x0, x


@triton.jit
def _cross_tile(B, N, head_ptr, tail_ptr, D0: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                GROUP_M: tl.constexpr):
    """This program's tile of the layer's [B, N] output: its rows and columns, where they lie
    in [B, N] and in x0's two parts, and which of them are inside."""
    # tiles in groups of GROUP_M rows of tiles, so that a group's h rows stay in L2 across N
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(B, BM)
    tiles_n = tl.cdiv(N, BN)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    rows_here = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % rows_here
    pid_n = (pid % in_group) // rows_here
    rm = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    inside = (rm[:, None] < B) & (rn[None, :] < N)
    at = rm[:, None] * N + rn[None, :]
    # x0 = [head | tail]: its columns below D0 from head [B, D0], the rest from tail [B, N - D0]
    head_at = head_ptr + rm[:, None] * D0 + rn[None, :]
    tail_at = tail_ptr + rm[:, None] * (N - D0) + (rn - D0)[None, :]
    in_head = inside & (rn < D0)[None, :]
    in_tail = inside & (rn >= D0)[None, :]
    return rm, rn, inside, at, head_at, tail_at, in_head, in_tail


@triton.jit
def _cross_product(h_ptr, w_ptr, rm, rn, B, N, R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr):
    """The tile's h @ w.T in FP32 (h [B, R], w [N, R], fp16 or e4m3 alike)."""
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, R, BK):
        a = tl.load(h_ptr + rm[:, None] * R + (k + rk)[None, :], mask=rm[:, None] < B, other=0.0)
        w = tl.load(w_ptr + rn[None, :] * R + (k + rk)[:, None], mask=rn[None, :] < N, other=0.0)
        acc = tl.dot(a, w, acc)
    return acc


@triton.jit
def _cross_layer_kernel(h_ptr, w_ptr, b_ptr, head_ptr, tail_ptr, x_ptr, out_ptr, B, N, R: tl.constexpr,
                        D0: tl.constexpr, FIRST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        GROUP_M: tl.constexpr, EARLY: tl.constexpr):
    rm, rn, inside, at, head_at, tail_at, in_head, in_tail = _cross_tile(B, N, head_ptr, tail_ptr, D0, BM, BN,
                                                                         GROUP_M)
    if EARLY:
        # the epilogue's tiles asked for before the product, so that their reads overlap it
        x0, x = _cross_layer_inputs(head_at, tail_at, x_ptr + at, in_head, in_tail, inside, FIRST)
    acc = _cross_product(h_ptr, w_ptr, rm, rn, B, N, R, BM, BN, BK)
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    if not EARLY:
        x0, x = _cross_layer_inputs(head_at, tail_at, x_ptr + at, in_head, in_tail, inside, FIRST)
    out = x0.to(tl.float32) * (acc + bias[None, :]) + x.to(tl.float32)
    tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=inside)


def cross_reference(head: torch.Tensor, tail: torch.Tensor, x: Optional[torch.Tensor], h: torch.Tensor,
                    weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The same layer in plain torch, x0 = [head | tail] (x: x0 itself where None)."""
    x0 = torch.cat([head, tail], dim=1)
    return x0 * torch.nn.functional.linear(h, weight, bias) + (x0 if x is None else x)


@triton_op("triton_rust::cross_layer", mutates_args={})
def cross_layer(head: torch.Tensor, tail: torch.Tensor, x: Optional[torch.Tensor], h: torch.Tensor,
                weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x0 * (h @ weight.T + bias) + x`` with ``x0 = [head | tail]`` along the columns, never
    concatenated: head [B, D0] (DCNv2's bottom MLP output), tail [B, N - D0] (its embeddings,
    flattened), x [B, N] or None for the first layer (x = x0), h [B, R], weight [N, R], bias [N]."""
    batch, rank = h.shape
    n = weight.shape[0]
    d0 = head.shape[1]
    bm, bn, bk, warps, stages, group, early = cross_config()
    if (rank % bk or weight.shape[1] != rank or head.shape[0] != batch or tail.shape != (batch, n - d0)
            or (x is not None and x.shape != (batch, n)) or bias.shape != (n,)):
        raise ValueError(f"cross_layer: h {tuple(h.shape)}, weight {tuple(weight.shape)}, head {tuple(head.shape)}, "
                         f"tail {tuple(tail.shape)}, x {None if x is None else tuple(x.shape)}, bias {tuple(bias.shape)} "
                         "(the rank a multiple of the tile's depth)")
    if not _interpreted(h) or h.dtype != torch.float16:
        return cross_reference(head, tail, x, h, weight, bias)
    head, tail, h, weight, bias = (t.contiguous() for t in (head, tail, h, weight, bias))
    first = x is None
    x = head if first else x.contiguous()  # not read for the first layer
    out = torch.empty((batch, n), dtype=h.dtype, device=h.device)
    grid = (triton.cdiv(batch, bm) * triton.cdiv(n, bn),)
    _launcher(_cross_layer_kernel)[grid](h, weight, bias, head, tail, x, out, batch, n, R=rank, D0=d0, FIRST=first,
                                         BM=bm, BN=bn, BK=bk, GROUP_M=group, EARLY=early, num_warps=warps,
                                         num_stages=stages)
    return out


CROSS_DEFAULT = "128x64x64w8s3"


def cross_config_text() -> str:
    """The cross-layer kernel's configuration in effect: $TRITON_RUST_CROSS (read when a module
    is exported, so a package keeps the one it was exported with), else CROSS_DEFAULT."""
    return os.environ.get("TRITON_RUST_CROSS") or CROSS_DEFAULT


def cross_config(text=None):
    """The cross-layer kernel's tile (rows x columns x depth), warps, pipeline stages, rows of
    tiles per group (`g`, default 8: a group's rows of h stay in L2 across the columns) and
    whether the epilogue's tiles are read before the product (a trailing `e`), as
    `BMxBNxBKwWsS[gG][e]`: `text`, else the configuration in effect (cross_config_text)."""
    text = text or cross_config_text()
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)(?:g(\d+))?(e?)", text)
    if not m:
        raise ValueError(f"cross-layer kernel config {text!r}: BMxBNxBKwWARPSsSTAGES[gGROUP][e], e.g. {CROSS_DEFAULT}")
    bm, bn, bk, warps, stages = (int(v) for v in m.groups()[:5])
    config = (bm, bn, bk, warps, stages, int(m.group(6) or 8), m.group(7) == "e")
    if bk % 16 or bm % 16 or bn % 16 or config[5] < 1:
        raise ValueError(f"cross-layer kernel config {text!r}: tiles are multiples of 16, groups at least 1 row")
    return config


@triton.jit
def _cross_layer_fp8_kernel(h_ptr, w_ptr, scales_ptr, b_ptr, head_ptr, tail_ptr, x_ptr, out_ptr, q_ptr, B, N,
                            R: tl.constexpr, D0: tl.constexpr, FIRST: tl.constexpr, WRITE_X: tl.constexpr,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                            EARLY: tl.constexpr):
    rm, rn, inside, at, head_at, tail_at, in_head, in_tail = _cross_tile(B, N, head_ptr, tail_ptr, D0, BM, BN,
                                                                         GROUP_M)
    if EARLY:
        x0, x = _cross_layer_inputs(head_at, tail_at, x_ptr + at, in_head, in_tail, inside, FIRST)
    acc = _cross_product(h_ptr, w_ptr, rm, rn, B, N, R, BM, BN, BK)
    scale = tl.load(scales_ptr) * tl.load(scales_ptr + 1)
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    if not EARLY:
        x0, x = _cross_layer_inputs(head_at, tail_at, x_ptr + at, in_head, in_tail, inside, FIRST)
    out = x0.to(tl.float32) * (acc * scale + bias[None, :]) + x.to(tl.float32)
    if WRITE_X:
        tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=inside)
    inv = tl.load(scales_ptr + 2)
    q = tl.clamp(out * inv, -448.0, 448.0)
    tl.store(q_ptr + at, q.to(q_ptr.dtype.element_ty), mask=inside)


def cross_fp8_reference(head: torch.Tensor, tail: torch.Tensor, x: Optional[torch.Tensor], hq: torch.Tensor,
                        weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor,
                        write_x: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """The same layer in plain torch, in FP32 from the FP8 operands: (x' in head's type, or an
    empty [0, N] where not ``write_x``; x' quantized to e4m3 with ``scales[2]``)."""
    x0 = torch.cat([head, tail], dim=1).float()
    acc = hq.float() @ weight.float().t()
    out = x0 * (acc * (scales[0].float() * scales[1].float()) + bias.float()) + (x0 if x is None else x.float())
    q = (out * scales[2].float()).clamp(-448.0, 448.0).to(weight.dtype)
    x16 = out.to(head.dtype) if write_x else out.new_empty((0, out.shape[1]), dtype=head.dtype)
    return x16, q


@triton_op("triton_rust::cross_layer_fp8", mutates_args={})
def cross_layer_fp8(head: torch.Tensor, tail: torch.Tensor, x: Optional[torch.Tensor], hq: torch.Tensor,
                    weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor,
                    write_x: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``x' = x0 * (hq @ weight.T * scales[0] * scales[1] + bias) + x`` (x0 = [head | tail], x =
    x0 where None) with ``hq`` [B, R] and ``weight`` [N, R] in float8 e4m3, ``scales`` FP32 [3]:
    hq's scale, weight's, and the inverse scale of the next FP8 layer's input (one tensor: passed
    as 0-dim tensors, one a product of two buffers, AOTInductor's export failed on a scalar
    constant Inductor had made of one).
    Returns x' in head's type ([0, N] where not ``write_x``) and x' * scales[2] in e4m3,
    saturated at 448, for the next FP8 layer."""
    batch, rank = hq.shape
    n = weight.shape[0]
    d0 = head.shape[1]
    bm, bn, bk, warps, stages, group, early = cross_config(cross_fp8_config_text())
    if (rank % bk or weight.shape[1] != rank or head.shape[0] != batch or tail.shape != (batch, n - d0)
            or (x is not None and x.shape != (batch, n)) or bias.shape != (n,) or hq.dtype != weight.dtype or scales.shape != (3,)):
        raise ValueError(f"cross_layer_fp8: hq {tuple(hq.shape)} {hq.dtype}, weight {tuple(weight.shape)} "
                         f"{weight.dtype}, head {tuple(head.shape)}, tail {tuple(tail.shape)}, "
                         f"x {None if x is None else tuple(x.shape)}, bias {tuple(bias.shape)}, scales {tuple(scales.shape)} "
                         "(the rank a multiple of the tile's depth)")
    if not _interpreted(hq) or head.dtype != torch.float16:
        return cross_fp8_reference(head, tail, x, hq, weight, scales, bias, write_x)
    head, tail, hq, weight, bias = (t.contiguous() for t in (head, tail, hq, weight, bias))
    first = x is None
    x = head if first else x.contiguous()
    out = torch.empty((batch if write_x else 0, n), dtype=head.dtype, device=head.device)
    q = torch.empty((batch, n), dtype=weight.dtype, device=head.device)
    grid = (triton.cdiv(batch, bm) * triton.cdiv(n, bn),)
    _launcher(_cross_layer_fp8_kernel)[grid](hq, weight, scales.contiguous(), bias, head, tail, x, out, q, batch, n,
                                             R=rank, D0=d0, FIRST=first, WRITE_X=write_x, BM=bm, BN=bn, BK=bk,
                                             GROUP_M=group, EARLY=early, num_warps=warps, num_stages=stages)
    return out, q


# the fastest of `run.sh cross --fp8 --batch 16384` on an H100 (bench/gpu/results/dlrm-v2-network/cross_fp8.log)
CROSS_FP8_DEFAULT = "64x128x128w8s3"


def cross_fp8_config_text() -> str:
    """The FP8 cross-layer kernel's configuration: $TRITON_RUST_CROSS_FP8 (read at export, as
    cross_config_text), else CROSS_FP8_DEFAULT; the same form as cross_config's."""
    return os.environ.get("TRITON_RUST_CROSS_FP8") or CROSS_FP8_DEFAULT
