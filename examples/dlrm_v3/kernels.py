"""DLRM-v3's attention as a Triton kernel over the jagged token sequence (issue 68, step 2's GPU
half), a ``torch.library.triton_op`` like examples/triton_kernels.py's: ``torch.export`` and
AOTInductor compile the kernel into a CUDA package, so the served package needs no Python; on CPU
tensors it is the masked formulation in plain torch (CPU packages, CI's served model), and
``TRITON_INTERPRET=1`` runs the kernel itself on CPU tensors (tests/tools/test_dlrm_v3_kernels.py).

The layout is network.py's: request b owns rows ``offsets[b] .. offsets[b + 1]`` of the flat
sequence, its user token, then its history (``hist_lengths[b]`` rows), then its candidates. Row i
of a request (0-based inside it) reads row j of the same request when j <= i and j is the user
token or history (j <= h), and itself: history causal, each candidate the prefix and itself.

    out_i = sum_j allowed(i, j) * SiLU(alpha * q_i . k_j) / norm * v_j        per head

One program takes a block of a request's rows for one head: it walks only the prefix's key
blocks up to its own last row (never another request's rows, never the candidates' keys) and
adds each candidate row's own term once, so a request costs its prefix times its rows, not the
batch's tokens squared as the masked form does. The key blocks below both the block's first row
and the prefix's end need no mask and take a loop of their own; the rest are masked.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

# How a launch is cut (`Blocks`): rows and keys a program takes at a time (Triton's dot wants 16
# or more on each side), its warps and pipeline stages, and whether SiLU is one `tanh.approx`
# (GPU only: silu(s) = s/2 * (1 + tanh(s/2)), one special-function op a score where the exact
# form takes an exponential and a division). TRITON_RUST_HSTU_BLOCKS="BM,BN,WARPS,STAGES[,exact|fast]"
# sets it for the launches (and so the packages) that follow; bench/gpu/dlrm_v3_kernel_check.py
# times the choices on a GPU.
BLOCKS_ENV = "TRITON_RUST_HSTU_BLOCKS"


class Blocks(NamedTuple):
    """The defaults are the fastest of the sweep within the bf16 bound (H200: 1.18 ms, 468
    TFLOP/s useful at the benchmark's shape, where 32,32,4,3,exact took 3.14 ms;
    `bench/gpu/results/dlrm-v3-check/`). Under Triton's interpreter SiLU is always exact."""
    bm: int = 128
    bn: int = 64
    warps: int = 8
    stages: int = 3
    fast: bool = True

    @classmethod
    def parse(cls, text: str) -> "Blocks":
        parts = [x.strip() for x in text.split(",") if x.strip()]
        if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] not in ("exact", "fast")):
            raise ValueError(f"{BLOCKS_ENV}: BM,BN,WARPS,STAGES[,exact|fast], not {text!r}")
        bm, bn, warps, stages = (int(x) for x in parts[:4])
        for name, x in (("BM", bm), ("BN", bn)):
            if x < 16 or x & (x - 1):
                raise ValueError(f"{BLOCKS_ENV}: {name} is a power of two of 16 or more, not {x}")
        return cls(bm, bn, warps, stages, len(parts) == 4 or parts[4] == "fast")

    def __str__(self) -> str:
        return f"{self.bm},{self.bn},{self.warps},{self.stages},{'fast' if self.fast else 'exact'}"


def blocks() -> Blocks:
    """The launches' blocks: TRITON_RUST_HSTU_BLOCKS, else the defaults."""
    text = os.environ.get(BLOCKS_ENV, "")
    return Blocks.parse(text) if text else Blocks()


@triton.jit
def _silu(s, FAST: tl.constexpr):
    if FAST:
        h = 0.5 * s
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [h], dtype=tl.float32,
                                      is_pure=True, pack=1)
        return h + h * t
    else:
        return s * tl.sigmoid(s)


@triton.jit
def _key_block(acc, q, k_ptr, v_ptr, start, n, i, rows, prefix, length, head, alpha, inv_norm,
               HEADS: tl.constexpr, DQK: tl.constexpr, DV: tl.constexpr, BN: tl.constexpr,
               FAST: tl.constexpr, MASKED: tl.constexpr):
    """`acc` plus the block's rows' weighted values of the keys n .. n + BN (MASKED: only those
    each row may read; else every row reads every key)."""
    j = n + tl.arange(0, BN)
    dq = tl.arange(0, DQK)
    dv = tl.arange(0, DV)
    if MASKED:
        keys = (j < prefix) & (j < length)
        k = tl.load(k_ptr + ((start + j[:, None]) * HEADS + head) * DQK + dq[None, :], mask=keys[:, None], other=0.0)
        v = tl.load(v_ptr + ((start + j[:, None]) * HEADS + head) * DV + dv[None, :], mask=keys[:, None], other=0.0)
    else:
        k = tl.load(k_ptr + ((start + j[:, None]) * HEADS + head) * DQK + dq[None, :])
        v = tl.load(v_ptr + ((start + j[:, None]) * HEADS + head) * DV + dv[None, :])
    s = tl.dot(q, tl.trans(k)).to(tl.float32) * alpha
    w = _silu(s, FAST) * inv_norm
    if MASKED:
        w = tl.where((j[None, :] <= i[:, None]) & keys[None, :] & rows[:, None], w, 0.0)
    return acc + tl.dot(w.to(v.dtype), v).to(tl.float32)


@triton.jit
def _hstu_attention_kernel(q_ptr, k_ptr, v_ptr, offsets_ptr, hist_ptr, norm_ptr, block_req_ptr, block_m_ptr,
                           out_ptr, alpha, HEADS: tl.constexpr, DQK: tl.constexpr, DV: tl.constexpr,
                           BM: tl.constexpr, BN: tl.constexpr, FAST: tl.constexpr):
    slot = tl.program_id(0)
    head = tl.program_id(1)
    # Inductor passes a Python float as fp64 (Triton's own launch as fp32): the scores in fp64
    # ran the kernel 2.8x slower through torch.compile and in the package (H200)
    alpha = tl.cast(alpha, tl.float32)
    b = tl.load(block_req_ptr + slot)
    m = tl.load(block_m_ptr + slot)
    if b >= 0:
        start = tl.load(offsets_ptr + b)
        length = tl.load(offsets_ptr + b + 1) - start
        prefix = 1 + tl.load(hist_ptr + b)  # the user token and the history
        inv_norm = 1.0 / tl.load(norm_ptr).to(tl.float32)  # once, not a division a score
        i = m * BM + tl.arange(0, BM)
        rows = i < length
        dq = tl.arange(0, DQK)
        dv = tl.arange(0, DV)
        q_at = q_ptr + ((start + i[:, None]) * HEADS + head) * DQK + dq[None, :]
        q = tl.load(q_at, mask=rows[:, None], other=0.0)
        acc = tl.zeros([BM, DV], dtype=tl.float32)
        # Keys below both the block's first row and the prefix's end are allowed to every row
        # of the block (history rows read earlier keys, candidates the whole prefix): no mask.
        # A row past the request has q = 0, so a weight of silu(0) = 0, and is not stored.
        free = (tl.minimum(m * BM, prefix) // BN) * BN
        for n in range(0, free, BN):
            acc = _key_block(acc, q, k_ptr, v_ptr, start, n, i, rows, prefix, length, head, alpha, inv_norm,
                             HEADS, DQK, DV, BN, FAST, False)
        # then the prefix's keys up to the block's last row, under the mask
        last = tl.minimum(m * BM + BM, prefix)
        for n in range(free, last, BN):
            acc = _key_block(acc, q, k_ptr, v_ptr, start, n, i, rows, prefix, length, head, alpha, inv_norm,
                             HEADS, DQK, DV, BN, FAST, True)
        # a candidate reads itself too
        cand = rows & (i >= prefix)
        k_self = tl.load(k_ptr + ((start + i[:, None]) * HEADS + head) * DQK + dq[None, :], mask=cand[:, None], other=0.0)
        v_self = tl.load(v_ptr + ((start + i[:, None]) * HEADS + head) * DV + dv[None, :], mask=cand[:, None], other=0.0)
        s_self = tl.sum(q.to(tl.float32) * k_self.to(tl.float32), axis=1) * alpha
        w_self = tl.where(cand, _silu(s_self, FAST) * inv_norm, 0.0)
        acc += w_self[:, None] * v_self.to(tl.float32)
        out_at = out_ptr + ((start + i[:, None]) * HEADS + head) * DV + dv[None, :]
        tl.store(out_at, acc.to(out_ptr.dtype.element_ty), mask=rows[:, None])


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, hist_lengths: torch.Tensor,
              norm: torch.Tensor, alpha: float) -> torch.Tensor:
    """The same attention in plain torch, under a [T, T] mask (network.py's CPU form):
    q, k [T, H, dqk], v [T, H, dv] -> [T, H, dv]."""
    total = q.shape[0]
    lengths = offsets[1:] - offsets[:-1]
    request = torch.repeat_interleave(torch.arange(lengths.shape[0], device=q.device), lengths, output_size=total)
    index = torch.arange(total, device=q.device) - offsets[:-1][request]
    same = request.view(-1, 1) == request.view(1, -1)
    i, j = index.view(-1, 1), index.view(1, -1)
    mask = same & ((j == i) | ((j < i) & (j <= hist_lengths[request].view(1, -1))))
    scores = torch.einsum("nhd,mhd->hnm", q, k) * alpha
    w = torch.where(mask.unsqueeze(0), F.silu(scores), torch.zeros((), dtype=scores.dtype)) / norm
    return torch.einsum("hnm,mhd->nhd", w, v)


def _interpreted() -> bool:
    """Whether Triton's interpreter runs the kernel (on the CPU, in numpy)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _runs_kernel(t: torch.Tensor) -> bool:
    """Whether the kernel runs: on CUDA tensors, or anywhere under Triton's interpreter."""
    return t.is_cuda or _interpreted()


def _launcher(kernel):
    # the interpreter's kernels are not JIT functions, which wrap_triton (for tracing) requires
    return kernel if _interpreted() else wrap_triton(kernel)


@triton_op("triton_rust::hstu_attention", mutates_args={})
def hstu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                   hist_lengths: torch.Tensor, norm: torch.Tensor, alpha: float) -> torch.Tensor:
    """DLRM-v3's jagged SiLU attention (see the module's note): q, k [T, H, dqk], v [T, H, dv],
    offsets [B + 1] int64 (each request's first row, then T), hist_lengths [B] int64, norm a
    scalar tensor. Returns [T, H, dv]."""
    total, heads, dqk = q.shape
    dv = v.shape[2]
    if k.shape != q.shape or v.shape[:2] != q.shape[:2] or dqk < 16 or dv < 16 or dqk & (dqk - 1) or dv & (dv - 1):
        raise ValueError(f"hstu_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "(widths powers of two, 16 or more)")
    if not _runs_kernel(q):
        return reference(q, k, v, offsets, hist_lengths, norm, alpha)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    cut = blocks()
    requests = hist_lengths.shape[0]
    slots = (total + cut.bm - 1) // cut.bm + requests
    # slot s: the request whose blocks reach past s, and the block's place in it, its last
    # block first (a block reads the keys before it: the last ones are the longest, started
    # first so that none is left running alone at the end)
    lengths = offsets[1:] - offsets[:-1]
    count = (lengths + cut.bm - 1) // cut.bm
    last = torch.cumsum(count, 0)
    s = torch.arange(slots, device=q.device)
    req = torch.searchsorted(last, s, right=True)
    inside = req < requests
    req_c = req.clamp(max=requests - 1)
    first = (last - count)[req_c]
    block_req = torch.where(inside, req, torch.full_like(req, -1))
    block_m = torch.where(inside, count[req_c] - 1 - (s - first), torch.zeros_like(s))
    out = torch.empty((total, heads, dv), dtype=v.dtype, device=v.device)
    _launcher(_hstu_attention_kernel)[(slots, heads)](q, k, v, offsets, hist_lengths, norm.reshape(1), block_req,
                                                     block_m, out, alpha, HEADS=heads, DQK=dqk, DV=dv, BM=cut.bm,
                                                     BN=cut.bn, FAST=cut.fast and not _interpreted(),  # no PTX there
                                                     num_warps=cut.warps, num_stages=cut.stages)
    return out
