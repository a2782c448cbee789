"""DLRM-v3's network after its lookups, as one module that torch.export takes (issue 68, step 2,
its CPU half): the rows come in (one per id, as the embedding store hands them out), jagged as
values and lengths, and the candidates' predictions go out, [sum c, tasks].

Every request of the batch is one stretch of a flat token sequence of B + sum h + sum c rows,

    [user 1] [history of 1] [candidates of 1] [user 2] [history of 2] [candidates of 2] ...

so no shape depends on the values: the sizes are the inputs' own (B, sum h, sum c), where the
padded layout needs the longest history (a value), which torch.export cannot follow. The
attention is the reference's SiLU attention, each row reading its own request only, history
causal and each candidate the prefix and itself (model.py's `candidate_aware_mask`, per
request): `kernels.hstu_attention`, a Triton kernel over the jagged rows on a GPU, and on the
CPU the same math under a [T, T] mask (CI's small model; quadratic in the batch's tokens).

What the attention divides by is the reference's: 1 + the longest history + the most candidates
of the batch (a tensor here, so it stays a value), or Config.attn_norm_len when that is set.
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import kernels
from .model import Batch, HstuRanker, time_buckets, time_of_day_and_week

# The network's inputs, in order, with their element types and widths (None: one value a row).
# `*_rows` come from the tables (float32, or float16 where the tables are fp16: as_stored); the
# rest from the request.
INPUTS: List[Tuple[str, torch.dtype, str]] = [
    ("user_rows", torch.float32, "table"),          # [B, table_dim]
    ("hist_lengths", torch.int64, ""),              # [B]
    ("hist_item_rows", torch.float32, "table"),     # [sum h, table_dim]
    ("hist_category_rows", torch.float32, "table"),  # [sum h, table_dim]
    ("hist_timestamps", torch.int64, ""),           # [sum h], seconds
    ("hist_actions", torch.int64, ""),              # [sum h], action bitmasks
    ("cand_lengths", torch.int64, ""),              # [B]
    ("cand_item_rows", torch.float32, "table"),     # [sum c, table_dim]
    ("cand_category_rows", torch.float32, "table"),  # [sum c, table_dim]
    ("query_times", torch.int64, ""),               # [B], seconds
]


def _segments(lengths: Tensor, total: int) -> Tuple[Tensor, Tensor]:
    """Jagged values of these [B] lengths, `total` of them: each value's request and its index
    within the request (output_size keeps the size the input's, not a value)."""
    b = lengths.shape[0]
    request = torch.repeat_interleave(torch.arange(b, device=lengths.device), lengths, output_size=total)
    starts = torch.cumsum(lengths, 0) - lengths
    return request, torch.arange(total, device=lengths.device) - starts[request]


class HstuNetwork(nn.Module):
    """The network of `ranker` (its weights, shared): rows in, predictions out; see the module's note."""

    def __init__(self, ranker: HstuRanker):
        super().__init__()
        self.ranker = ranker
        self.fixed_norm = ranker.cfg.attn_norm_len

    def forward(self, user_rows: Tensor, hist_lengths: Tensor, hist_item_rows: Tensor,
                hist_category_rows: Tensor, hist_timestamps: Tensor, hist_actions: Tensor,
                cand_lengths: Tensor, cand_item_rows: Tensor, cand_category_rows: Tensor,
                query_times: Tensor) -> Tensor:
        x, offsets, norm, cand_at, cand_req = self.tokens(
            user_rows, hist_lengths, hist_item_rows, hist_category_rows, hist_timestamps, hist_actions,
            cand_lengths, cand_item_rows, cand_category_rows, query_times)
        x = self.layers(x, offsets, hist_lengths, norm)
        return self.score(x, cand_at, cand_req, query_times, cand_item_rows, cand_category_rows)

    def tokens(self, user_rows: Tensor, hist_lengths: Tensor, hist_item_rows: Tensor,
               hist_category_rows: Tensor, hist_timestamps: Tensor, hist_actions: Tensor,
               cand_lengths: Tensor, cand_item_rows: Tensor, cand_category_rows: Tensor,
               query_times: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The jagged sequence the layers read (user token, history, candidates, request after
        request, with positions and times added), its request offsets, the attention's
        normaliser, and each candidate's row and request."""
        r, cfg = self.ranker, self.ranker.cfg
        dtype = cfg.dtype
        b, nh, nc = user_rows.shape[0], hist_item_rows.shape[0], cand_item_rows.shape[0]
        total = b + nh + nc
        h, c = hist_lengths, cand_lengths
        seq = 1 + h + c
        start = torch.cumsum(seq, 0) - seq
        hist_req, hist_idx = _segments(h, nh)
        cand_req, cand_idx = _segments(c, nc)
        hist_at = start[hist_req] + 1 + hist_idx
        cand_at = start[cand_req] + 1 + h[cand_req] + cand_idx
        # tokens
        user = (user_rows.to(dtype) * ((h + c) >= cfg.user_min_seq_len).to(dtype).view(-1, 1)) @ r.user_weight + r.user_bias
        hist = (r.content_mlp(hist_item_rows.to(dtype)) + r.category_mlp(hist_category_rows.to(dtype))
                + r.history_action_tokens(hist_actions))
        cand = (r.content_mlp(cand_item_rows.to(dtype)) + r.category_mlp(cand_category_rows.to(dtype))
                + r.candidate_action_token())
        x = user_rows.new_zeros((total, cfg.model_dim), dtype=dtype)
        x = x.index_copy(0, start, user).index_copy(0, hist_at, hist).index_copy(0, cand_at, cand)
        # positions (user 0, history item i of h at h + 1 - i, candidates 1) and times
        one = torch.ones(nc, dtype=torch.long, device=x.device)
        positions = torch.zeros(total, dtype=torch.long, device=x.device)
        positions = positions.index_copy(0, hist_at, (h[hist_req] + 1 - hist_idx).clamp(max=cfg.num_position_buckets - 1))
        positions = positions.index_copy(0, cand_at, one)
        stamps = torch.zeros(total, dtype=torch.long, device=x.device)
        stamps = stamps.index_copy(0, hist_at, hist_timestamps).index_copy(0, cand_at, query_times[cand_req])
        tok_req, _ = _segments(seq, total)
        x = (x * math.sqrt(cfg.model_dim) + r.position_table[positions]
             + r.time_table[time_buckets(query_times[tok_req] - stamps, cfg)])
        if self.fixed_norm is not None:
            norm = torch.full((), float(self.fixed_norm), dtype=dtype, device=x.device)
        else:
            norm = (1 + h.max() + c.max()).to(dtype)
        offsets = torch.cat([start, start.new_full((1,), total)])
        return x, offsets, norm, cand_at, cand_req

    def layers(self, x: Tensor, offsets: Tensor, hist_lengths: Tensor, norm: Tensor) -> Tensor:
        """The HSTU layers over the jagged sequence `x` (requests at `offsets`)."""
        for layer in self.ranker.layers:
            u, q, k, v = layer.project(x)
            # each row reads its own request: itself, and earlier rows of the user token and
            # history (kernels.py: the Triton kernel on a GPU, the masked form on the CPU)
            attn = kernels.hstu_attention(q, k, v, offsets, hist_lengths, norm, layer.alpha)
            x = layer.finish(x, u, attn.flatten(1))
        return x

    def score(self, x: Tensor, cand_at: Tensor, cand_req: Tensor, query_times: Tensor,
              cand_item_rows: Tensor, cand_category_rows: Tensor) -> Tensor:
        """Per candidate: its output row and the query's time meet its own item rows in the head."""
        r, dtype = self.ranker, self.ranker.cfg.dtype
        out = x.index_select(0, cand_at)
        times = time_of_day_and_week(query_times[cand_req]).to(dtype)
        user_c = r.post_norm(r.post_dense(torch.cat([out, times], -1)))
        item_c = r.item_mlp(torch.cat([cand_item_rows.to(dtype), cand_category_rows.to(dtype)], -1))
        # fp32 out whatever the layers ran in (the served config's TYPE_FP32 predictions)
        return r.predictions(r.head(user_c * item_c)).float()


def as_stored(rows: Tensor) -> Tensor:
    """Rows as the store hands them to the network: an fp16 table's as stored, any other's in fp32
    (the network casts either to its own dtype; fp16 to bf16 directly rounds as through fp32)."""
    return rows if rows.dtype == torch.float16 else rows.float()


def rows_of(ranker: HstuRanker, batch: Batch) -> Dict[str, Tensor]:
    """The network's inputs for `batch`, its rows looked up in the ranker's own tables: what the
    embedding store hands the network when it serves the model."""
    def rows(table, ids):
        return as_stored(F.embedding(ids, table))
    return {
        "user_rows": rows(ranker.user_table, batch.user_ids),
        "hist_lengths": batch.hist_lengths,
        "hist_item_rows": rows(ranker.item_table, batch.hist_item_ids),
        "hist_category_rows": rows(ranker.category_table, batch.hist_category_ids),
        "hist_timestamps": batch.hist_timestamps.long(),
        "hist_actions": batch.hist_actions.long(),
        "cand_lengths": batch.cand_lengths,
        "cand_item_rows": rows(ranker.item_table, batch.cand_item_ids),
        "cand_category_rows": rows(ranker.category_table, batch.cand_category_ids),
        "query_times": batch.query_times.long(),
    }


def export(network: HstuNetwork, example: Dict[str, Tensor]):
    """torch.export of the network with the batch, the histories' and the candidates' totals
    dynamic: one program for any ragged batch."""
    bsz = torch.export.Dim("requests", min=1, max=4096)
    hist = torch.export.Dim("history_rows", min=0, max=1 << 24)
    cand = torch.export.Dim("candidate_rows", min=1, max=1 << 22)
    per = {"user_rows": {0: bsz}, "hist_lengths": {0: bsz}, "cand_lengths": {0: bsz}, "query_times": {0: bsz},
           "hist_item_rows": {0: hist}, "hist_category_rows": {0: hist}, "hist_timestamps": {0: hist},
           "hist_actions": {0: hist}, "cand_item_rows": {0: cand}, "cand_category_rows": {0: cand}}
    args = tuple(example[name] for name, _, _ in INPUTS)
    shapes = tuple(per[name] for name, _, _ in INPUTS)
    return torch.export.export(network, args, dynamic_shapes=shapes)


def package(network: HstuNetwork, example: Dict[str, Tensor], path: str) -> Dict[str, str]:
    """The exported network as an AOTInductor package at `path`, with the metadata our aoti engine
    reads (examples/aoti_export.py), its inputs under INPUTS' names and its output `predictions`.
    About a minute of compiling on two cores for Config.tiny(). Returns the metadata."""
    import json

    import aoti_export  # examples/, on the path of whoever runs this
    import model_files

    exported = export(network, example)
    meta = aoti_export.metadata(exported)
    inputs = json.loads(meta[aoti_export.INPUTS_KEY])
    for entry, (name, _, _) in zip(inputs, INPUTS):
        entry["name"] = name
    outputs = json.loads(meta[aoti_export.OUTPUTS_KEY])
    outputs[0]["name"] = "predictions"
    meta = {**meta, aoti_export.INPUTS_KEY: json.dumps(inputs), aoti_export.OUTPUTS_KEY: json.dumps(outputs)}
    size = sum(t.numel() * t.element_size() for t in network.state_dict().values())
    model_files.ensure_free_space(path, size, "AOTInductor package")
    # On a GPU, Inductor tunes its kernels by running them; at compile time it would feed them
    # random tensors, and the positions and time buckets this network computes from its inputs
    # then index past their tables (a device-side assert, seen on an H200). Off, it tunes on a
    # first pass over the example's real inputs instead. The CPU ignores the setting.
    torch._inductor.aoti_compile_and_package(exported, package_path=path, inductor_configs={
        "aot_inductor.metadata": meta, "triton.autotune_at_compile_time": False})
    return meta
