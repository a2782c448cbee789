"""Synthetic DLRM-v3 requests with the benchmark's shapes and distributions, written from what
the reference's generator and loader do (mlcommons/inference recommendation/dlrm_v3/
streaming_synthetic_data.py and datasets/synthetic_streaming.py; docs/dlrm-v3.md says more).

The benchmark's data is a stream: each user has a base history chunk, then one chunk per
timestamp step in which the user is active (probability 0.7 each of 100 steps; 90 for training,
10 for inference). A request at inference step t scores that step's 2,048 items against
everything before: the base chunk, the active training chunks and part of each active earlier
inference chunk. Each chunk draws its items' categories from a Polya urn over the user's 4
categories (each draw makes that category likelier), and each item uniformly from the part of
its category's id range open at that step (the catalogue opens up over the steps). Nothing in
the reference draws ids from a Zipf law; `item_ids="zipf"` is our option for cache studies.

Unlike the reference, which writes 2 TB of CSV up front, this makes one request at a time from a
seeded generator, so any request is reproducible alone: request i of seed s always comes from
numpy.random.default_rng([s, i]).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch

if __package__:
    from .model import Batch, Request
else:  # run as a script: python examples/dlrm_v3/data.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model import Batch, Request

# Per-item base rating (the reference draws one per item id, seeded, from these odds).
ITEM_RATINGS = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
ITEM_RATING_ODDS = np.array([0.2, 0.25, 0.25, 0.2, 0.1])
# Ratings by the quarter of the user's category list an item's category sits in (favourites
# first): three levels, shifted by cosines of the step, and their odds.
QUARTER_LEVELS = np.array([[4.5, 4.0, 3.5], [4.5, 4.0, 3.5], [3.5, 3.0, 2.5], [2.5, 2.0, 1.5]])
QUARTER_ODDS = np.array([[0.8, 0.2, 0.0], [0.1, 0.8, 0.1], [0.1, 0.8, 0.1], [0.1, 0.8, 0.1]])
SPREAD_PRIME = 2_147_483_647  # scatters Zipf ranks over the id range (as bench/gpu/zipf_keys.py)


@dataclass
class DataConfig:
    """Defaults are the benchmark's (streaming_synthetic_data.py main(), utils.py get_dataset,
    configs.py); the fields after `max_history_len` are ours."""

    num_users: int = 5_000_000
    num_items: int = 1_000_000_000
    num_categories: int = 128
    categories_per_user: int = 4
    num_timestamps: int = 100
    train_ratio: float = 0.9  # steps 0..89 train, 90..99 inference
    avg_samples_per_item: int = 50
    user_sampling_ratio: float = 0.7  # chance a user is active at a step
    num_candidates: int = 2048  # items of an inference step: a request's candidates
    num_eval_candidates: int = 32  # the eval step's items; chunks are at least this + 1 long
    urn_alpha_range: Tuple[int, int] = (1, 500)  # the urn's prior weight, drawn per chunk
    action_weights: Tuple[int, ...] = (1, 2, 4, 8, 16)  # rating r (1-5) sets bit r - 1
    # The loader's cap: max_seq_len 16,384 - 32 candidates (training's count, used at inference
    # too) - 1 user token. It keeps the first, oldest, items.
    max_history_len: int = 16384 - 32 - 1
    # Ours. None: num_items * avg_samples_per_item / num_users / num_timestamps (100).
    chunk_len_mean: Optional[float] = None
    min_candidates: Optional[int] = None  # None: every request has num_candidates (the reference)
    item_ids: str = "streaming"  # "streaming" (the reference) or "zipf"
    zipf_alpha: float = 1.05
    seconds_per_timestamp: int = 0  # 0: the reference's stamps (all 1, query time 1)
    start_time: int = 1_700_000_000

    @classmethod
    def tiny(cls, **overrides) -> "DataConfig":
        """Matches model.Config.tiny(): 4,096 items, histories of at most 64."""
        small = dict(num_users=1000, num_items=4096, num_timestamps=10, chunk_len_mean=5.0,
                     num_candidates=16, num_eval_candidates=2, max_history_len=64)
        small.update(overrides)
        return cls(**small)

    @property
    def train_steps(self) -> int:
        return int(self.num_timestamps * self.train_ratio)

    @property
    def items_per_category(self) -> int:
        return self.num_items // self.num_categories

    @property
    def mean_chunk_len(self) -> float:
        if self.chunk_len_mean is not None:
            return float(self.chunk_len_mean)
        return float(int(self.num_items * self.avg_samples_per_item / self.num_users
                         / self.num_timestamps))

    @property
    def min_chunk_len(self) -> int:
        return self.num_eval_candidates + 1


def expected_history_len(cfg: DataConfig, step: int) -> float:
    """Mean history length at inference step `step`, before the cap and ignoring the minimum chunk
    length: the base chunk plus the expected number of active earlier steps."""
    active_before = cfg.user_sampling_ratio * step
    return cfg.mean_chunk_len * (1 + active_before)


def item_base_ratings(item_ids: np.ndarray) -> np.ndarray:
    """A fixed rating per item id with the reference's odds. The reference stores one drawn per id
    (a 1e9-long array); a hash of the id (splitmix64's finalizer) gives the same law without it."""
    z = item_ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return ITEM_RATINGS[np.searchsorted(np.cumsum(ITEM_RATING_ODDS), u, side="right").clip(0, 4)]


def zipf_ranks(rng: np.random.Generator, n: int, alpha: float, count: int) -> np.ndarray:
    """Ranks in [0, n), P(r) about (r + 1)^-alpha: the continuous law inverted and floored."""
    u = rng.random(count)
    if abs(alpha - 1.0) < 1e-9:
        x = np.exp(u * math.log(n + 1))
    else:
        x = (1 + u * ((n + 1) ** (1 - alpha) - 1)) ** (1 / (1 - alpha))
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, n - 1)


def spread(ranks: np.ndarray, n: int) -> np.ndarray:
    """A bijection of [0, n) so that the hottest ranks are not simply the smallest ids."""
    p = SPREAD_PRIME % n if n > 1 else 0
    while n > 1 and math.gcd(p, n) != 1:
        p += 1
    return (ranks * p) % n if n > 1 else ranks


class _User:
    """One user's state while their stream is drawn: categories and the urn's counts."""

    def __init__(self, cfg: DataConfig, rng: np.random.Generator):
        self.cfg, self.rng = cfg, rng
        self.categories = rng.choice(cfg.num_categories, cfg.categories_per_user, replace=False)
        self.counts = np.zeros(cfg.categories_per_user)

    def chunk_len(self) -> int:
        """Gaussian around the mean (sd: a quarter of it, as an integer), at least min_chunk_len."""
        mean = self.cfg.mean_chunk_len
        return max(self.cfg.min_chunk_len, int(round(self.rng.normal(mean, mean // 4))))

    def chunk(self, step: int, n: int) -> Tuple[np.ndarray, np.ndarray]:
        """n items the user meets at `step` (-1: the base chunk): ids and ratings."""
        cfg, rng, k = self.cfg, self.rng, self.cfg.categories_per_user
        alpha = rng.integers(cfg.urn_alpha_range[0], cfg.urn_alpha_range[1] + 1)
        odds = (alpha / k + self.counts) / (alpha + self.counts.sum())
        which = rng.choice(k, size=n, p=odds)  # index into the user's category list
        self.counts += np.bincount(which, minlength=k)
        # The part of each category's id range open at this step: 1/100 at the base chunk,
        # (step + 1)/100 after.
        open_len = max(1, int(cfg.items_per_category * max(step + 1, 1) / cfg.num_timestamps))
        if cfg.item_ids == "zipf":
            within = spread(zipf_ranks(rng, open_len, cfg.zipf_alpha, n), open_len)
        elif cfg.item_ids == "streaming":
            within = rng.integers(0, open_len, size=n)
        else:
            raise ValueError(f"item_ids is 'streaming' or 'zipf', not {cfg.item_ids!r}")
        ids = self.categories[which] * cfg.items_per_category + within
        # Which quarter of the category list: 4 categories -> one each.
        quarter = np.searchsorted(np.array([k // 4, k // 2, k // 4 * 3]), which, side="right")
        shift = 0.5 * np.cos(np.array([step, step + 2, step + 4]) * math.pi / 4)
        level = (np.cumsum(QUARTER_ODDS[quarter], 1) < rng.random((n, 1))).sum(1).clip(0, 2)
        category_rating = QUARTER_LEVELS[quarter, level] + shift[level]
        return ids.astype(np.int64), (category_rating + item_base_ratings(ids)) / 2


def _stamps(cfg: DataConfig, rng: np.random.Generator, step: int, n: int) -> np.ndarray:
    if cfg.seconds_per_timestamp == 0:
        return np.ones(n, dtype=np.int64)  # the reference's loader stamps every item 1
    base = cfg.start_time + (step + 1) * cfg.seconds_per_timestamp
    return np.sort(base + rng.integers(0, cfg.seconds_per_timestamp, size=n))


def generate_request(cfg: DataConfig, rng: np.random.Generator, step: int) -> Request:
    """The request of one user active at inference step `step`."""
    if not cfg.train_steps <= step < cfg.num_timestamps:
        raise ValueError(f"inference steps are {cfg.train_steps}..{cfg.num_timestamps - 1}, not {step}")
    user = _User(cfg, rng)
    user_id = int(rng.integers(cfg.num_users))
    chunks: List[Tuple[int, np.ndarray, np.ndarray]] = [(-1, *user.chunk(-1, user.chunk_len()))]
    for t in range(cfg.train_steps):
        if rng.random() < cfg.user_sampling_ratio:
            chunks.append((t, *user.chunk(t, user.chunk_len())))
    # The eval step is drawn (it moves the urn) but is no part of an inference history.
    user.chunk(cfg.train_steps, cfg.num_eval_candidates)
    for t in range(cfg.train_steps, step):
        if rng.random() < cfg.user_sampling_ratio:
            ids, ratings = user.chunk(t, cfg.num_candidates)
            keep = np.sort(rng.choice(cfg.num_candidates, min(user.chunk_len(), cfg.num_candidates),
                                      replace=False))
            chunks.append((t, ids[keep], ratings[keep]))
    n_cand = cfg.num_candidates
    if cfg.min_candidates is not None:
        n_cand = int(rng.integers(cfg.min_candidates, cfg.num_candidates + 1))
    cand_ids, cand_ratings = user.chunk(step, n_cand)

    ids = np.concatenate([c[1] for c in chunks])[: cfg.max_history_len]
    ratings = np.concatenate([c[2] for c in chunks])[: cfg.max_history_len]
    stamps = np.concatenate([_stamps(cfg, rng, t, len(c)) for t, c, _ in chunks])[: cfg.max_history_len]
    query_time = 1 if cfg.seconds_per_timestamp == 0 else (
        cfg.start_time + (step + 1) * cfg.seconds_per_timestamp)
    weights = np.array(cfg.action_weights)
    return Request(
        user_id=user_id,
        item_ids=torch.from_numpy(ids),
        category_ids=torch.from_numpy(ids // cfg.items_per_category),
        timestamps=torch.from_numpy(stamps.astype(np.int64)),
        actions=torch.from_numpy(weights[ratings.astype(np.int64) - 1].astype(np.int64)),
        cand_item_ids=torch.from_numpy(cand_ids),
        cand_category_ids=torch.from_numpy(cand_ids // cfg.items_per_category),
        query_time=query_time,
        cand_labels=torch.from_numpy((cand_ratings >= 3.5).astype(np.float32)),
    )


def generate_batch(cfg: DataConfig, batch_size: int, seed: int = 0,
                   step: Optional[int] = None) -> Batch:
    """batch_size requests at inference step `step` (default: the first, 90), request i from
    numpy.random.default_rng([seed, i])."""
    step = cfg.train_steps if step is None else step
    return Batch.from_requests([generate_request(cfg, np.random.default_rng([seed, i]), step)
                                for i in range(batch_size)])


def main() -> None:
    p = argparse.ArgumentParser(description="Print the shapes of synthetic DLRM-v3 requests.")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--tiny", action="store_true", help="DataConfig.tiny() instead of the benchmark's")
    a = p.parse_args()
    cfg = DataConfig.tiny() if a.tiny else DataConfig()
    step = cfg.train_steps if a.step is None else a.step
    b = generate_batch(cfg, a.requests, a.seed, step)
    print(f"step {step}: mean history expected {expected_history_len(cfg, step):.0f}")
    for r in b.requests():
        print(f"user {r.user_id}: history {len(r.item_ids)}, candidates {len(r.cand_item_ids)}, "
              f"positive {int(r.cand_labels.sum())}")


if __name__ == "__main__":
    main()
