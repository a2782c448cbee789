"""DLRM's dot interaction as one Triton kernel, for CUDA AOTInductor packages.

The network's interaction takes the bottom MLP's output ``x`` [B, D] and the 26 embeddings
``emb`` [B, 26, D], forms the 27 vectors' pairwise dot products below the diagonal (in
``torch.tril_indices(27, 27, -1)`` order, vector 0 being ``x``) and hands the top MLP
``[x | pairs | zero padding]``. Written with ``torch.bmm`` (``recommenders.DLRM``'s ``cat`` and
``split`` forms), Inductor runs it as two batched products that read the embeddings twice
(cuBLAS picks WMMA kernels aligned to two elements for 65,536 products of 26 x 128 x 26),
then gathers the pairs and concatenates: on an H100 at batch 65536 about 0.7 ms of a 1.8 ms
network (bench/gpu/results/aoti_h100_b/network_profile). This kernel reads each sample's
27 vectors once, multiplies them on the tensor cores (one 32 x 128 x 32 product per sample,
FP32 accumulation) and writes the top MLP's input whole.

``dot_interaction`` is a ``torch.library.triton_op``: ``torch.export`` and AOTInductor see the
kernel and compile it into the package, so the served package needs no Python. On CPU
tensors it is the same function in plain torch (CPU packages, the tests' reference).
``TRITON_INTERPRET=1`` runs the kernel itself on CPU tensors (tests/tools/test_dot_interaction.py).
"""
import os

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
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


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
    # the interpreter's kernels are not JIT functions, which wrap_triton (for tracing) requires
    kernel = _dot_interaction_kernel if os.environ.get("TRITON_INTERPRET") == "1" else wrap_triton(_dot_interaction_kernel)
    kernel[(batch,)](x, emb, out, TABLES=tables, DIM=dim, WIDTH=width, PAIRS=pairs,
                     PAD=width - dim - pairs, ROWS_=ROWS, num_warps=4)
    return out
