"""examples/dlrm_v3 (issue 68, step 1), on the CPU with a small instance (2 layers, widths
32-64, tables of 4,096 rows, histories of at most 64): the jagged path (one request at a time,
no mask tensor) and the padded path ([B, N, D] under a mask) give the same scores; a candidate's
score does not move when other candidates come or go (with the attention normalizer held fixed;
the reference's own normalizer is the batch's padded length, and a test shows that coupling);
the model reads history in order; one seed gives one model; and the request generator keeps to
the benchmark's shapes and bounds, reproducibly."""
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from dlrm_v3 import data as dv3_data  # noqa: E402
from dlrm_v3 import model as dv3  # noqa: E402

STEP = 9  # DataConfig.tiny(): 10 steps, 9 for training, so 9 is its inference step
FIXED_NORM = 100


@pytest.fixture(scope="module")
def model():
    return dv3.HstuRanker(dv3.Config.tiny()).eval()


def edge_requests():
    """Hand-made: no history; a history past the position table (48 buckets); a request short
    enough (5 items) that the user token is zeroed; one candidate only."""
    g = torch.Generator().manual_seed(7)

    def req(h, c, user):
        ids = torch.randint(0, 4096, (h + c,), generator=g)
        return dv3.Request(
            user_id=user, item_ids=ids[:h], category_ids=ids[:h] // 32,
            timestamps=1_700_000_000 + torch.arange(h) * 600,
            actions=torch.tensor([1, 2, 4, 8, 16, 3, 0])[torch.randint(0, 7, (h,), generator=g)],
            cand_item_ids=ids[h:], cand_category_ids=ids[h:] // 32, query_time=1_700_050_000)

    return [req(0, 3, 1), req(64, 1, 2), req(3, 2, 3), req(30, 16, 4)]


def mixed_batch(seed=0):
    cfg = dv3_data.DataConfig.tiny(seconds_per_timestamp=3600, min_candidates=1)
    generated = dv3_data.generate_batch(cfg, 5, seed, STEP).requests()
    return dv3.Batch.from_requests(generated + edge_requests())


def long_history_requests(n, seed=0):
    """Requests whose history alone reaches user_min_seq_len, so the user token is kept whatever
    the candidates (the reference gates it on history + candidates)."""
    cfg = dv3_data.DataConfig.tiny(seconds_per_timestamp=3600)
    reqs = [r for r in dv3_data.generate_batch(cfg, 3 * n, seed, STEP).requests() if len(r.item_ids) >= 20]
    assert len(reqs) >= n
    return reqs[:n]


# ---- the model -------------------------------------------------------------------------------

def test_defaults_are_the_benchmarks_and_its_tables_are_never_allocated():
    c = dv3.Config()
    assert (c.num_layers, c.num_heads, c.attn_dim, c.linear_dim) == (5, 4, 128, 128)
    assert (c.model_dim, c.table_dim, c.max_seq_len, c.max_candidates) == (512, 512, 16384, 2048)
    assert (c.num_item_rows, c.num_user_rows, c.num_category_rows) == (10**9, 10**7, 128)
    assert (c.num_position_buckets, c.num_time_buckets) == (8192, 2048)
    with pytest.raises(ValueError, match="never allocated"):
        dv3.HstuRanker(c)


@pytest.mark.parametrize("norm", [None, FIXED_NORM], ids=["reference-norm", "fixed-norm"])
def test_jagged_and_padded_paths_agree(model, norm):
    batch = mixed_batch()
    with torch.no_grad():
        jagged = model.forward_jagged(batch, norm)
        padded = model.forward_padded(batch, norm)
    assert jagged.shape == (int(batch.cand_lengths.sum()), 1)
    assert torch.isfinite(jagged).all()
    diff = (jagged - padded).abs().max().item()
    print(f"jagged vs padded, {batch.batch_size} requests, {jagged.shape[0]} candidates: "
          f"max |logit diff| {diff:.2e}")
    assert diff <= 1e-5
    assert (model.predictions(jagged) - model.predictions(padded)).abs().max() <= 1e-5


@pytest.mark.parametrize("path", ["jagged", "padded"])
def test_a_candidates_score_ignores_the_other_candidates(model, path):
    reqs = long_history_requests(3)
    full = model.score_candidates(dv3.Batch.from_requests(reqs), path, FIXED_NORM)
    rng = np.random.default_rng(1)
    fewer, kept_rows, start = [], [], 0
    for r in reqs:
        c = len(r.cand_item_ids)
        keep = rng.permutation(c)[: rng.integers(1, c)]  # drop some, shuffle the rest
        extra = torch.from_numpy(rng.integers(0, 4096, 3))  # and add new ones at the end
        fewer.append(dv3.Request(
            user_id=r.user_id, item_ids=r.item_ids, category_ids=r.category_ids,
            timestamps=r.timestamps, actions=r.actions,
            cand_item_ids=torch.cat([r.cand_item_ids[keep], extra]),
            cand_category_ids=torch.cat([r.cand_category_ids[keep], extra // 32]),
            query_time=r.query_time))
        kept_rows.append(torch.from_numpy(start + keep))
        start += c
    changed = model.score_candidates(dv3.Batch.from_requests(fewer), path, FIXED_NORM)
    ours, start = [], 0
    for f, rows in zip(fewer, kept_rows):
        ours.append(changed[start: start + len(rows)])
        start += len(f.cand_item_ids)
    diff = (torch.cat(ours) - full[torch.cat(kept_rows)]).abs().max().item()
    print(f"{path}: kept candidates' scores moved by at most {diff:.2e}")
    assert diff <= 1e-5


def test_reference_normalizer_couples_a_request_to_its_batch(model):
    """The reference divides SiLU attention by the batch's padded length (1 + longest history +
    most candidates). More candidates on request 1 then move request 0's scores; a fixed
    normalizer keeps them."""
    a, b = long_history_requests(2)
    more = dv3.Request(**{**b.__dict__, "cand_item_ids": torch.cat([b.cand_item_ids] * 3),
                          "cand_category_ids": torch.cat([b.cand_category_ids] * 3)})
    n0 = len(a.cand_item_ids)
    for norm, moves in ((None, True), (FIXED_NORM, False)):
        before = model.score_candidates(dv3.Batch.from_requests([a, b]), "padded", norm)[:n0]
        after = model.score_candidates(dv3.Batch.from_requests([a, more]), "padded", norm)[:n0]
        moved = (before - after).abs().max().item()
        print(f"normalizer {norm or 'reference'}: request 0 moved by {moved:.2e}")
        assert (moved > 1e-5) if moves else (moved <= 1e-6)


def shuffled_histories(batch):
    out = []
    for i, r in enumerate(batch.requests()):
        p = torch.from_numpy(np.random.default_rng(i).permutation(len(r.item_ids)))
        out.append(dv3.Request(**{**r.__dict__, "item_ids": r.item_ids[p],
                                  "category_ids": r.category_ids[p], "actions": r.actions[p]}))
    return dv3.Batch.from_requests(out)


def test_history_order_matters_and_one_seed_is_one_model(model):
    """Order enters through the position table and through causal attention among history items.
    Logits are compared: at random weights the position rows are small (the reference's init,
    uniform within +-sqrt(1 / buckets)), so a permutation moves logits by ~1e-4, far above the
    ~1e-7 of float noise. With one layer and no position rows, candidates read the history as a
    set, and a permutation must change nothing."""
    # The benchmark's stamps (all 1): a permutation moves positions only, not time buckets.
    batch = dv3_data.generate_batch(dv3_data.DataConfig.tiny(), 4, 3, STEP)
    permuted = shuffled_histories(batch)
    cand = batch.cand_lengths.tolist()
    with torch.no_grad():
        logits, moved = model.forward_padded(batch), model.forward_padded(permuted)
    for req, (s, t) in enumerate(zip(logits.split(cand), moved.split(cand))):
        print(f"request {req}: a shuffled history moves its logits by {(s - t).abs().max():.2e}")
        assert (s - t).abs().max() > 1e-5, f"request {req}: order made no difference"
    bag = dv3.HstuRanker(dv3.Config.tiny(num_layers=1)).eval()
    bag.position_table.data.zero_()
    for path in ("jagged", "padded"):
        assert (bag.score_candidates(batch, path) - bag.score_candidates(permuted, path)).abs().max() <= 1e-5
    scores = model.score_candidates(batch)
    again = dv3.HstuRanker(dv3.Config.tiny()).eval()
    assert torch.equal(again.score_candidates(batch), scores)
    assert torch.equal(model.score_candidates(batch), scores)
    other = dv3.HstuRanker(dv3.Config.tiny(seed=1)).eval()
    assert (other.score_candidates(batch) - scores).abs().max() > 1e-3


def test_dtypes_and_tasks():
    batch = mixed_batch(2)
    f32 = dv3.HstuRanker(dv3.Config.tiny()).eval().score_candidates(batch)
    f64 = dv3.HstuRanker(dv3.Config.tiny(dtype=torch.float64)).eval().score_candidates(batch)
    bf16 = dv3.HstuRanker(dv3.Config.tiny(dtype=torch.bfloat16)).eval().score_candidates(batch)
    assert f64.dtype == torch.float64 and bf16.dtype == torch.bfloat16
    d64, d16 = (f64 - f32.double()).abs().max().item(), (bf16.float() - f32).abs().max().item()
    print(f"predictions vs float32: float64 {d64:.2e}, bfloat16 {d16:.2e}")
    assert d64 <= 1e-5 and d16 <= 0.1
    two = dv3.HstuRanker(dv3.Config.tiny(tasks=(("click", "binary"), ("watch", "regression"))))
    logits = two.forward_padded(batch)
    preds = two.eval().score_candidates(batch)
    assert preds.shape == (int(batch.cand_lengths.sum()), 2)
    assert torch.allclose(preds[:, 0], torch.sigmoid(logits[:, 0]).detach())
    assert torch.allclose(preds[:, 1], logits[:, 1].detach())


# ---- the request generator -------------------------------------------------------------------

def check_request(r, cfg, n_cand):
    h, c = len(r.item_ids), len(r.cand_item_ids)
    assert min(cfg.min_chunk_len, cfg.max_history_len) <= h <= cfg.max_history_len
    assert c == n_cand if isinstance(n_cand, int) else n_cand[0] <= c <= n_cand[1]
    for ids, cats in ((r.item_ids, r.category_ids), (r.cand_item_ids, r.cand_category_ids)):
        assert ids.dtype == torch.long and 0 <= int(ids.min()) and int(ids.max()) < cfg.num_items
        assert torch.equal(cats, ids // cfg.items_per_category)
    # Every item is from one of the user's categories.
    assert len(set(r.category_ids.tolist()) | set(r.cand_category_ids.tolist())) <= cfg.categories_per_user
    assert set(r.actions.tolist()) <= set(cfg.action_weights)
    assert set(r.cand_labels.tolist()) <= {0.0, 1.0}
    assert 0 <= r.user_id < cfg.num_users


def test_generator_keeps_to_the_tiny_bounds_and_the_mean_history():
    cfg = dv3_data.DataConfig.tiny()
    batch = dv3_data.generate_batch(cfg, 200, 0, STEP)
    for r in batch.requests():
        check_request(r, cfg, cfg.num_candidates)
        assert torch.equal(r.timestamps, torch.ones_like(r.timestamps)) and r.query_time == 1
    mean = batch.hist_lengths.double().mean().item()
    want = dv3_data.expected_history_len(cfg, STEP)
    print(f"tiny: mean history {mean:.1f}, expected {want:.1f}")
    assert abs(mean - want) < 3


def test_generator_at_the_benchmarks_size():
    cfg = dv3_data.DataConfig()
    assert (cfg.num_items, cfg.num_categories, cfg.num_candidates, cfg.max_history_len) == (
        10**9, 128, 2048, 16351)
    assert cfg.mean_chunk_len == 100 and cfg.train_steps == 90
    r = dv3_data.generate_batch(cfg, 1, 0).requests()[0]
    check_request(r, cfg, 2048)
    print(f"benchmark size: history {len(r.item_ids)} (expected mean "
          f"{dv3_data.expected_history_len(cfg, 90):.0f}), candidates {len(r.cand_item_ids)}")


def test_generator_is_reproducible_request_by_request():
    cfg = dv3_data.DataConfig.tiny(min_candidates=4, seconds_per_timestamp=3600)
    a, b = dv3_data.generate_batch(cfg, 5, 11, STEP), dv3_data.generate_batch(cfg, 5, 11, STEP)
    for name, value in a.__dict__.items():
        assert torch.equal(value, getattr(b, name)), name
    assert not torch.equal(dv3_data.generate_batch(cfg, 5, 12, STEP).hist_item_ids[:20], a.hist_item_ids[:20])
    # Request i does not depend on how many are drawn with it.
    first3 = dv3_data.generate_batch(cfg, 3, 11, STEP).requests()
    for r, s in zip(first3, a.requests()[:3]):
        assert torch.equal(r.item_ids, s.item_ids) and torch.equal(r.cand_item_ids, s.cand_item_ids)
    for r in a.requests():
        check_request(r, cfg, (4, 16))
        stamps = r.timestamps
        assert bool((stamps[1:] >= stamps[:-1]).all()) and int(stamps.max()) < r.query_time


def test_zipf_option_skews_ids_toward_each_categorys_hottest():
    def hottest_share(kind):
        cfg = dv3_data.DataConfig.tiny(item_ids=kind)
        b = dv3_data.generate_batch(cfg, 30, 5, STEP)
        for r in b.requests():
            check_request(r, cfg, cfg.num_candidates)
        within = torch.cat([b.hist_item_ids, b.cand_item_ids]) % cfg.items_per_category
        return (within == 0).double().mean().item()  # spread() maps rank 0 to offset 0

    uniform, zipf = hottest_share("streaming"), hottest_share("zipf")
    print(f"share of each category's hottest id: streaming {uniform:.3f}, zipf {zipf:.3f}")
    assert zipf > 1.5 * uniform
    with pytest.raises(ValueError, match="streaming"):
        dv3_data.generate_batch(dv3_data.DataConfig.tiny(item_ids="pareto"), 1, 0, STEP)
