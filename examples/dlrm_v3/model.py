"""Our PyTorch reference of MLPerf Inference's DLRM-v3 ranking model: HSTU ("Actions speak
louder than words", Zhai et al. 2024), written from the math of the MLCommons reference
(mlcommons/inference, recommendation/dlrm_v3/, which vendors the modules of
facebookresearch/generative-recommenders). docs/dlrm-v3.md lists each fact and the file it
was read in; no code of those repositories is copied here.

A request is a user, the user's history (items, their categories, timestamps and action
bitmasks, oldest first) and the candidate items to score. The network sees one sequence:

    [user token] [history 1 .. history h] [candidate 1 .. candidate c]

HSTU layers run over it with history causal and each candidate reading the user token, the
whole history and itself, never another candidate; each candidate's output row, with its time
of day and week, meets the candidate's own item embedding in the prediction head.

Two paths give the same numbers: `forward_jagged` loops over requests (no padding and no mask
tensor: a candidate's attention is written as 'the prefix, plus itself'), `forward_padded` runs
the batch as dense [B, N, D] tensors under a mask. tests/tools/test_dlrm_v3_reference.py holds
them equal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The postprocessor's time features: (seconds a unit, units a period): hour of day, day of week.
TIME_FEATURES = ((3600, 24), (86400, 7))
# The reference turns the position in the period into an angle with 2 * 3.14, not 2 * pi;
# a checkpoint trained with it needs the same constant.
TWO_PI_AS_IN_REFERENCE = 2 * 3.14


@dataclass
class Config:
    """Defaults are the benchmark's (configs.py of the reference); row counts are parameters so a
    small instance fits in memory."""

    num_layers: int = 5
    num_heads: int = 4
    attn_dim: int = 128  # per head: Q and K
    linear_dim: int = 128  # per head: U and V
    model_dim: int = 512  # the sequence's width (hstu_transducer_embedding_dim)
    table_dim: int = 512  # embedding rows' width (hstu_embedding_table_dim)
    preprocessor_hidden_dim: int = 256
    item_mlp_hidden_dim: int = 512  # the item tower's hidden width (fixed in dlrm_hstu.py)
    head_hidden_dim: int = 512  # the prediction head's hidden width (fixed in dlrm_hstu.py)
    num_item_rows: int = 1_000_000_000  # item_id table, fp16 in the benchmark
    num_user_rows: int = 10_000_000  # user_id table
    num_category_rows: int = 128  # item_category_id table
    action_weights: Tuple[int, ...] = (1, 2, 4, 8, 16)  # one bit per action type
    action_embedding_dim: int = 8
    action_init_std: float = 5.0
    num_position_buckets: int = 8192
    num_time_buckets: int = 2048
    time_bucket_seconds: float = 60.0
    user_min_seq_len: int = 20  # the user token is zero below this many items (see user_tokens)
    max_seq_len: int = 16384
    max_candidates: int = 2048
    tasks: Tuple[Tuple[str, str], ...] = (("rating", "binary"),)  # (name, binary|regression)
    # What SiLU attention divides by: None is the reference's (the batch's padded length, see
    # HstuRanker.attention_norm_len); a number fixes it so no request depends on its batch.
    attn_norm_len: Optional[int] = None
    dtype: torch.dtype = torch.float32
    table_dtype: Optional[torch.dtype] = None  # None: dtype (the benchmark's tables are fp16)
    seed: int = 0
    # The 1e9 x 512 item table (1 TB in fp16) is never allocated here: larger tables are refused.
    max_table_elements: int = 1 << 28

    @classmethod
    def tiny(cls, **overrides) -> "Config":
        """A small instance for CPU tests: 2 layers, widths 32-64, tables of a few thousand rows,
        and position/time tables short enough that long histories reach their last bucket."""
        small = dict(
            num_layers=2, num_heads=2, attn_dim=32, linear_dim=32, model_dim=64, table_dim=32,
            preprocessor_hidden_dim=48, item_mlp_hidden_dim=64, head_hidden_dim=32,
            num_item_rows=4096, num_user_rows=1000, num_position_buckets=48, num_time_buckets=16,
            max_seq_len=128, max_candidates=16,
        )
        small.update(overrides)
        return cls(**small)


@dataclass
class Request:
    """One request, unbatched. History tensors are [h] (oldest first), candidates' [c]."""

    user_id: int
    item_ids: Tensor
    category_ids: Tensor
    timestamps: Tensor  # seconds
    actions: Tensor  # bitmask over Config.action_weights
    cand_item_ids: Tensor
    cand_category_ids: Tensor
    query_time: int  # seconds; every candidate of the request is scored at this time
    cand_labels: Optional[Tensor] = None  # ground truth where known (the generator's)


def offsets_of(lengths: Tensor) -> Tensor:
    """[B] lengths -> [B + 1] offsets."""
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


@dataclass
class Batch:
    """Jagged batch of B requests: per-request values concatenated, with lengths [B]."""

    user_ids: Tensor  # [B]
    hist_lengths: Tensor  # [B]
    hist_item_ids: Tensor  # [sum h]
    hist_category_ids: Tensor
    hist_timestamps: Tensor
    hist_actions: Tensor
    cand_lengths: Tensor  # [B]
    cand_item_ids: Tensor  # [sum c]
    cand_category_ids: Tensor
    query_times: Tensor  # [B]
    cand_labels: Optional[Tensor] = None  # [sum c]

    def to(self, device) -> "Batch":
        """The same batch with its tensors on `device`."""
        return Batch(**{k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(self).items()})

    @property
    def batch_size(self) -> int:
        return int(self.user_ids.numel())

    def requests(self) -> List[Request]:
        ho, co = offsets_of(self.hist_lengths).tolist(), offsets_of(self.cand_lengths).tolist()
        out = []
        for b in range(self.batch_size):
            h, c = slice(ho[b], ho[b + 1]), slice(co[b], co[b + 1])
            out.append(Request(
                user_id=int(self.user_ids[b]), item_ids=self.hist_item_ids[h],
                category_ids=self.hist_category_ids[h], timestamps=self.hist_timestamps[h],
                actions=self.hist_actions[h], cand_item_ids=self.cand_item_ids[c],
                cand_category_ids=self.cand_category_ids[c], query_time=int(self.query_times[b]),
                cand_labels=None if self.cand_labels is None else self.cand_labels[c]))
        return out

    @classmethod
    def from_requests(cls, requests: List[Request]) -> "Batch":
        def cat(name):
            return torch.cat([getattr(r, name).long() for r in requests])

        def lengths(name):
            return torch.tensor([len(getattr(r, name)) for r in requests], dtype=torch.long)

        labels = None
        if all(r.cand_labels is not None for r in requests):
            labels = torch.cat([r.cand_labels for r in requests])
        return cls(
            user_ids=torch.tensor([r.user_id for r in requests], dtype=torch.long),
            hist_lengths=lengths("item_ids"), hist_item_ids=cat("item_ids"),
            hist_category_ids=cat("category_ids"), hist_timestamps=cat("timestamps"),
            hist_actions=cat("actions"), cand_lengths=lengths("cand_item_ids"),
            cand_item_ids=cat("cand_item_ids"), cand_category_ids=cat("cand_category_ids"),
            query_times=torch.tensor([r.query_time for r in requests], dtype=torch.long),
            cand_labels=labels)


# ---- building blocks -------------------------------------------------------------------------

def _xavier(fan_in: int, fan_out: int, g: torch.Generator) -> Tensor:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return (torch.rand(fan_in, fan_out, generator=g) * 2 - 1) * bound


def _near(value: float, n: int, g: torch.Generator, std: float = 0.02) -> Tensor:
    # Biases and norm affines start near (not at) the reference's 0 and 1 so that every
    # parameter moves the output and a test that mixes two up would see it.
    return value + std * torch.randn(n, generator=g)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm over the last dim in float32, cast back: the reference normalizes in float32
    whatever the dtype."""
    return F.layer_norm(x.float(), x.shape[-1:], weight.float(), bias.float(), eps).to(x.dtype)


class Dense(nn.Module):
    """x @ W + b, W stored [in, out]."""

    def __init__(self, n_in: int, n_out: int, g: torch.Generator, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(_xavier(n_in, n_out, g))
        self.bias = nn.Parameter(_near(0.0, n_out, g)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


class Norm(nn.Module):
    def __init__(self, n: int, g: torch.Generator, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(_near(1.0, n, g))
        self.bias = nn.Parameter(_near(0.0, n, g))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)


class SwishNorm(Norm):
    """x * sigmoid(LayerNorm(x)): the activation of every MLP in the model."""

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.sigmoid(layer_norm(xf, self.weight, self.bias, self.eps))).to(x.dtype)


def mlp(n_in: int, hidden: int, n_out: int, g: torch.Generator) -> nn.Sequential:
    """The reference's MLP shape everywhere: Linear, SwishNorm, Linear, LayerNorm."""
    return nn.Sequential(Dense(n_in, hidden, g), SwishNorm(hidden, g), Dense(hidden, n_out, g),
                         Norm(n_out, g))


# ---- the HSTU layer --------------------------------------------------------------------------

class HstuLayer(nn.Module):
    """One HSTU layer. With x the sequence [.., N, D]:

        U, V, Q, K = split(LayerNorm(x) @ W_uvqk + b_uvqk);  U = SiLU(U)   (only U is activated)
        A_h        = sum_j  mask_ij * SiLU(alpha * q_i . k_j) / n  * v_j    per head, no softmax
        Y          = U * LayerNorm(A)                                       (A: heads concatenated)
        x'         = x + [U, A, Y] @ W_out                                  (no bias)

    alpha = 1 / sqrt(attn_dim); n is HstuRanker.attention_norm_len. The attention itself lives in
    attention_one_request / attention_padded: the two paths differ only there."""

    def __init__(self, cfg: Config, g: torch.Generator):
        super().__init__()
        d, h, dqk, dv = cfg.model_dim, cfg.num_heads, cfg.attn_dim, cfg.linear_dim
        self.heads, self.dqk, self.dv = h, dqk, dv
        self.alpha = 1.0 / math.sqrt(dqk)
        self.in_norm = Norm(d, g, eps=1e-6)
        self.uvqk = Dense(d, h * (2 * dv + 2 * dqk), g)
        self.attn_norm = Norm(h * dv, g, eps=1e-6)
        self.out_weight = nn.Parameter(_xavier(3 * h * dv, d, g))

    def project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """u [.., N, H*dv] (SiLU'd); q, k [.., N, H, dqk]; v [.., N, H, dv]."""
        h, dqk, dv = self.heads, self.dqk, self.dv
        u, v, q, k = self.uvqk(self.in_norm(x)).split([h * dv, h * dv, h * dqk, h * dqk], -1)
        return (F.silu(u), q.unflatten(-1, (h, dqk)), k.unflatten(-1, (h, dqk)),
                v.unflatten(-1, (h, dv)))

    def finish(self, x: Tensor, u: Tensor, attn: Tensor) -> Tensor:
        """The gate, the output projection and the residual; attn is [.., N, H*dv]. Like the
        reference, the gated norm is taken in float32."""
        uf, af = u.float(), attn.float()
        y = uf * layer_norm(af, self.attn_norm.weight, self.attn_norm.bias, self.attn_norm.eps)
        return x + torch.cat([uf, af, y], -1).to(x.dtype) @ self.out_weight


def attention_one_request(q: Tensor, k: Tensor, v: Tensor, prefix_len: int, norm_len: int,
                          alpha: float) -> Tensor:
    """SiLU attention of one request, no mask tensor. q, k [L, H, dqk], v [L, H, dv]; the first
    prefix_len rows are the user token and the history, the rest candidates. Returns [L, H*dv]."""
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, L, d]
    p = prefix_len
    # User token and history: causal, each row reading itself and what came before it.
    w = F.silu(alpha * q[:, :p] @ k[:, :p].transpose(1, 2)) / norm_len
    out_prefix = torch.tril(w) @ v[:, :p]
    # Candidates: the whole prefix, plus themselves; never another candidate.
    w_prefix = F.silu(alpha * q[:, p:] @ k[:, :p].transpose(1, 2)) / norm_len
    w_self = F.silu(alpha * (q[:, p:] * k[:, p:]).sum(-1, keepdim=True)) / norm_len
    out_cand = w_prefix @ v[:, :p] + w_self * v[:, p:]
    return torch.cat([out_prefix, out_cand], 1).transpose(0, 1).flatten(1)


def candidate_aware_mask(hist_lengths: Tensor, n: int) -> Tensor:
    """[B, N, N] for the padded layout [user, history, candidates, padding]: row i may read
    column j when j == i, or when j < i and j is the user token or history (j <= h). Candidates
    thus read the prefix and themselves; padding columns are never read by a real row."""
    i = torch.arange(n, device=hist_lengths.device).view(1, n, 1)
    j = torch.arange(n, device=hist_lengths.device).view(1, 1, n)
    return (j == i) | ((j < i) & (j <= hist_lengths.view(-1, 1, 1)))


def attention_padded(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, norm_len: int,
                     alpha: float) -> Tensor:
    """SiLU attention of a padded batch: q, k [B, N, H, dqk], v [B, N, H, dv], mask [B, N, N].
    Returns [B, N, H*dv]."""
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) * alpha
    w = torch.where(mask[:, None], F.silu(scores), torch.zeros((), dtype=scores.dtype)) / norm_len
    return torch.einsum("bhnm,bmhd->bnhd", w, v).flatten(2)


# ---- positions and times ---------------------------------------------------------------------

def positions_one_request(h: int, c: int, num_buckets: int, device=None) -> Tensor:
    """Position buckets of one sequence: 0 for the user token; h + 1 - i for history item i
    (0-based, so the newest is 2): its distance from the end of the history; 1 for every
    candidate (all sit just past the history). Far items share the last bucket."""
    hist = (h + 1 - torch.arange(h, device=device)).clamp(max=num_buckets - 1)
    return torch.cat([torch.zeros(1, dtype=torch.long, device=device), hist,
                      torch.ones(c, dtype=torch.long, device=device)])


def positions_padded(hist_lengths: Tensor, n: int, num_buckets: int) -> Tensor:
    """The same buckets for the padded layout, [B, N]: column j of a request with h history items
    is bucket (1 + h) - min(j, 1 + h) + 1, the user token's 0."""
    j = torch.arange(n, device=hist_lengths.device).view(1, n)
    end = (1 + hist_lengths).view(-1, 1)
    pos = (end - torch.minimum(j, end) + 1).clamp(max=num_buckets - 1)
    pos[:, 0] = 0
    return pos


def time_buckets(delta_seconds: Tensor, cfg: Config) -> Tensor:
    """Bucket of query_time - t: floor(sqrt(delta / 60 s)), delta clamped to >= 1e-6 s (items
    stamped after the query share bucket 0), large deltas sharing the table's last row."""
    d = delta_seconds.double().clamp(min=1e-6) / cfg.time_bucket_seconds
    return d.sqrt().floor().clamp(0, cfg.num_time_buckets).long()


def time_of_day_and_week(t: Tensor) -> Tensor:
    """[n] seconds -> [n, 4]: cos and sin of the hour of day, then of the day of week. Integer
    arithmetic for the unit count (the reference divides in float32, exact only for times up to
    2^24 s; the benchmark's are all 1)."""
    cols = []
    for seconds, units in TIME_FEATURES:
        phase = torch.remainder(torch.div(t, seconds, rounding_mode="floor"), units).double()
        angle = phase / units * TWO_PI_AS_IN_REFERENCE
        cols += [torch.cos(angle), torch.sin(angle)]
    return torch.stack(cols, -1)


def segment_rows(lengths: Tensor) -> Tuple[Tensor, Tensor]:
    """For jagged values with these [B] lengths: each value's request and index within it."""
    request = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    index = torch.arange(int(lengths.sum()), device=lengths.device) - offsets_of(lengths)[:-1][request]
    return request, index


# ---- the model -------------------------------------------------------------------------------

class HstuRanker(nn.Module):
    """DLRM-v3's ranking model. Tokens are built from embedding rows, one row per id (no pooling):

        history item   content_mlp(item row) + category_mlp(category row) + action_mlp(its action bits)
        candidate      content_mlp(item row) + category_mlp(category row) + action_mlp(learned 'target' actions)
        user token     user row @ W_user + b_user  (zero row when history + candidates < user_min_seq_len)

    then x * sqrt(model_dim) + position row + time row, the HSTU layers, and per candidate:

        user_c = LayerNorm(Linear([out_c, time of day and week of the query]))
        item_c = item_mlp([item row, category row])
        logits = head(user_c * item_c)          one column per task; binary tasks read through a sigmoid
    """

    def __init__(self, cfg: Config):
        super().__init__()
        for rows in (cfg.num_item_rows, cfg.num_user_rows, cfg.num_category_rows):
            if rows * cfg.table_dim > cfg.max_table_elements:
                raise ValueError(
                    f"a table of {rows} x {cfg.table_dim} is past max_table_elements "
                    f"({cfg.max_table_elements}): the benchmark's tables are never allocated "
                    "here; pass small row counts (Config.tiny())")
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        d, t = cfg.model_dim, cfg.table_dim
        # Tables: the category table's init is the reference's uniform(-1, 1); the others'
        # (unstated there) TorchRec's default, uniform(+-sqrt(1 / rows)).
        self.item_table = nn.Parameter(self._uniform(cfg.num_item_rows, t, g))
        self.user_table = nn.Parameter(self._uniform(cfg.num_user_rows, t, g))
        self.category_table = nn.Parameter((torch.rand(cfg.num_category_rows, t, generator=g) * 2 - 1))
        # Input preprocessing.
        self.content_mlp = mlp(t, cfg.preprocessor_hidden_dim, d, g)
        self.category_mlp = mlp(t, cfg.preprocessor_hidden_dim, d, g)
        n_act = len(cfg.action_weights)
        self.register_buffer("action_bits", torch.tensor(cfg.action_weights, dtype=torch.long))
        self.action_table = nn.Parameter(
            cfg.action_init_std * torch.randn(n_act, cfg.action_embedding_dim, generator=g))
        self.target_actions = nn.Parameter(
            cfg.action_init_std * torch.randn(n_act * cfg.action_embedding_dim, generator=g))
        self.action_mlp = mlp(n_act * cfg.action_embedding_dim, cfg.preprocessor_hidden_dim, d, g)
        self.user_weight = nn.Parameter(math.sqrt(2.0 / (t + d)) * torch.randn(t, d, generator=g))
        self.user_bias = nn.Parameter(_near(0.0, d, g))
        self.position_table = nn.Parameter(self._uniform(cfg.num_position_buckets, d, g))
        self.time_table = nn.Parameter(self._uniform(cfg.num_time_buckets + 1, d, g,
                                                     bound_rows=cfg.num_time_buckets))
        # The HSTU stack.
        self.layers = nn.ModuleList([HstuLayer(cfg, g) for _ in range(cfg.num_layers)])
        # Output postprocessing, item tower and prediction head.
        self.post_dense = Dense(d + 2 * len(TIME_FEATURES), d, g)
        self.post_norm = Norm(d, g)
        self.item_mlp = mlp(2 * t, cfg.item_mlp_hidden_dim, d, g)
        self.head = nn.Sequential(Dense(d, cfg.head_hidden_dim, g), SwishNorm(cfg.head_hidden_dim, g),
                                  Dense(cfg.head_hidden_dim, len(cfg.tasks), g))
        # Random values are drawn in float32 and cast, so every dtype holds the same weights.
        self.to(cfg.dtype)
        table_dtype = cfg.table_dtype or cfg.dtype
        for table in (self.item_table, self.user_table, self.category_table):
            table.data = table.data.to(table_dtype)

    @staticmethod
    def _uniform(rows: int, dim: int, g: torch.Generator, bound_rows: Optional[int] = None) -> Tensor:
        bound = math.sqrt(1.0 / (bound_rows or rows))
        return (torch.rand(rows, dim, generator=g) * 2 - 1) * bound

    # -- tokens (row-wise: the same for both paths) --

    def _rows(self, table: Tensor, ids: Tensor) -> Tensor:
        return F.embedding(ids, table).to(self.cfg.dtype)

    def item_tokens(self, item_ids: Tensor, category_ids: Tensor) -> Tensor:
        return (self.content_mlp(self._rows(self.item_table, item_ids))
                + self.category_mlp(self._rows(self.category_table, category_ids)))

    def history_action_tokens(self, actions: Tensor) -> Tensor:
        """Each action type whose bit is set contributes its row; the rows are concatenated."""
        bits = (actions.view(-1, 1) & self.action_bits.view(1, -1)) > 0  # [n, A]
        rows = bits.unsqueeze(-1).to(self.cfg.dtype) * self.action_table  # [n, A, 8]
        return self.action_mlp(rows.flatten(1))

    def candidate_action_token(self) -> Tensor:
        """Candidates have no actions yet: one learned vector stands for them, [1, D]."""
        return self.action_mlp(self.target_actions.view(1, -1))

    def user_tokens(self, user_ids: Tensor, seq_lengths: Tensor) -> Tensor:
        """[B, D]. As in the reference, the row is zeroed when the request's history plus
        candidates number fewer than user_min_seq_len (the reference compares the merged
        length, candidates included)."""
        rows = self._rows(self.user_table, user_ids)
        keep = (seq_lengths >= self.cfg.user_min_seq_len).to(rows.dtype).view(-1, 1)
        return (rows * keep) @ self.user_weight + self.user_bias

    def add_positions_and_times(self, x: Tensor, positions: Tensor, deltas: Tensor) -> Tensor:
        return (x * math.sqrt(self.cfg.model_dim) + self.position_table[positions]
                + self.time_table[time_buckets(deltas, self.cfg)])

    def attention_norm_len(self, batch: Batch, override: Optional[int] = None) -> int:
        """What SiLU attention divides by. The reference divides by the padded length of the batch
        it runs: 1 (user token) + the longest history + the most candidates in the batch, so a
        request's scores move with what it is batched with; a fixed number (the argument, or
        Config.attn_norm_len) makes each request's scores its own."""
        if override is not None:
            return int(override)
        if self.cfg.attn_norm_len is not None:
            return int(self.cfg.attn_norm_len)
        return 1 + int(batch.hist_lengths.max()) + int(batch.cand_lengths.max())

    def score_rows(self, cand_out: Tensor, query_times: Tensor, item_ids: Tensor,
                   category_ids: Tensor) -> Tensor:
        """Candidates' HSTU outputs [n, D] -> logits [n, tasks]."""
        times = time_of_day_and_week(query_times).to(cand_out.dtype)
        user = self.post_norm(self.post_dense(torch.cat([cand_out, times], -1)))
        item = self.item_mlp(torch.cat([self._rows(self.item_table, item_ids),
                                        self._rows(self.category_table, category_ids)], -1))
        return self.head(user * item)

    # -- the jagged path: one request at a time --

    def forward_jagged(self, batch: Batch, attn_norm_len: Optional[int] = None) -> Tensor:
        """Logits [sum c, tasks], requests in order, candidates in order."""
        norm = self.attention_norm_len(batch, attn_norm_len)
        return torch.cat([self._one_request(r, norm) for r in batch.requests()])

    def _one_request(self, r: Request, norm_len: int) -> Tensor:
        h, c = len(r.item_ids), len(r.cand_item_ids)
        dev = r.cand_item_ids.device
        x = torch.cat([
            self.user_tokens(torch.tensor([r.user_id], device=dev), torch.tensor([h + c], device=dev)),
            self.item_tokens(r.item_ids, r.category_ids) + self.history_action_tokens(r.actions),
            self.item_tokens(r.cand_item_ids, r.cand_category_ids) + self.candidate_action_token(),
        ])
        # The user token is stamped 0, candidates at the query time.
        stamps = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), r.timestamps.long(),
                            torch.full((c,), r.query_time, dtype=torch.long, device=dev)])
        x = self.add_positions_and_times(
            x, positions_one_request(h, c, self.cfg.num_position_buckets, dev), r.query_time - stamps)
        for layer in self.layers:
            u, q, k, v = layer.project(x)
            x = layer.finish(x, u, attention_one_request(q, k, v, 1 + h, norm_len, layer.alpha))
        return self.score_rows(x[1 + h:], torch.full((c,), r.query_time, dtype=torch.long, device=dev),
                               r.cand_item_ids, r.cand_category_ids)

    # -- the padded path: the batch as [B, N, D] --

    def forward_padded(self, batch: Batch, attn_norm_len: Optional[int] = None) -> Tensor:
        """Logits [sum c, tasks] in the jagged path's order. Layout per request:
        [user token, history, candidates, padding], N = 1 + longest history + most candidates."""
        norm = self.attention_norm_len(batch, attn_norm_len)
        h, c = batch.hist_lengths, batch.cand_lengths
        b, n, d = batch.batch_size, 1 + int(h.max()) + int(c.max()), self.cfg.model_dim
        hist_req, hist_idx = segment_rows(h)
        cand_req, cand_idx = segment_rows(c)
        hist_col = 1 + hist_idx
        cand_col = 1 + h[cand_req] + cand_idx
        dev = batch.user_ids.device
        x = torch.zeros(b, n, d, dtype=self.cfg.dtype, device=dev)
        x[:, 0] = self.user_tokens(batch.user_ids, h + c)
        x[hist_req, hist_col] = (self.item_tokens(batch.hist_item_ids, batch.hist_category_ids)
                                 + self.history_action_tokens(batch.hist_actions))
        x[cand_req, cand_col] = (self.item_tokens(batch.cand_item_ids, batch.cand_category_ids)
                                 + self.candidate_action_token())
        stamps = torch.zeros(b, n, dtype=torch.long, device=dev)
        stamps[hist_req, hist_col] = batch.hist_timestamps.long()
        stamps[cand_req, cand_col] = batch.query_times[cand_req]
        x = self.add_positions_and_times(
            x, positions_padded(h, n, self.cfg.num_position_buckets),
            batch.query_times.view(-1, 1) - stamps)
        mask = candidate_aware_mask(h, n)
        for layer in self.layers:
            u, q, k, v = layer.project(x)
            x = layer.finish(x, u, attention_padded(q, k, v, mask, norm, layer.alpha))
        return self.score_rows(x[cand_req, cand_col], batch.query_times[cand_req],
                               batch.cand_item_ids, batch.cand_category_ids)

    # -- scores --

    def predictions(self, logits: Tensor) -> Tensor:
        """Binary tasks through a sigmoid, regression tasks as they are."""
        cols = [torch.sigmoid(logits[:, i]) if kind == "binary" else logits[:, i]
                for i, (_, kind) in enumerate(self.cfg.tasks)]
        return torch.stack(cols, -1)

    @torch.no_grad()
    def score_candidates(self, batch: Batch, path: str = "padded",
                         attn_norm_len: Optional[int] = None) -> Tensor:
        """One row per candidate, [sum c, tasks]: the tasks' predictions."""
        forward = {"padded": self.forward_padded, "jagged": self.forward_jagged}[path]
        return self.predictions(forward(batch, attn_norm_len))
