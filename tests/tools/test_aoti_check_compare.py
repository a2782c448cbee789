"""bench/gpu/aoti_check.py's comparison of FastPitch on a GPU: relative to each output's
scale, and an item whose frame count differs passes only where the durations that round apart
lie at .5 within the tolerance."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu"))
from aoti_check import compare_fastpitch  # noqa: E402

TOL = 1e-3


def outputs(frames, durations, scale=10.0, seed=0):
    """FastPitch-shaped outputs: mel [B, 80, max frames] zero past each item's length, lengths
    [B, 1], durations and pitch [B, T]."""
    g = np.random.default_rng(seed)
    mel = np.zeros((len(frames), 80, max(frames)), np.float32)
    for i, n in enumerate(frames):
        mel[i, :, :n] = scale * g.standard_normal((80, n))
    dur = np.asarray(durations, np.float32)
    return [mel, np.asarray(frames, np.int64)[:, None], dur, np.zeros_like(dur)]


def test_equal_and_relative():
    want = outputs([10, 8], [[2.0, 3.0], [4.0, 4.0]])
    assert compare_fastpitch(want, want, TOL) == (0.0, [])
    got = [x.copy() for x in want]
    got[0][0, 0, 0] += 5e-3  # 5e-4 of a mel whose largest value is about 10 x 4
    diff, notes = compare_fastpitch(got, want, TOL)
    assert 0 < diff < TOL and notes == []


def test_a_frame_more_at_a_half_passes_with_a_note():
    want = outputs([10, 8], [[2.5004, 3.0], [4.0, 4.0]])
    got = [x.copy() for x in want]
    got[0] = want[0][:, :, :9].copy()
    got[1] = np.array([[9], [8]])
    got[2] = np.array([[2.4999, 3.0], [4.0, 4.0]], np.float32)
    diff, notes = compare_fastpitch(got, want, TOL)
    assert diff < TOL and len(notes) == 1 and "item 0" in notes[0]


def test_a_frame_more_away_from_a_half_fails():
    want = outputs([10, 8], [[2.3, 3.0], [4.0, 4.0]])
    got = [x.copy() for x in want]
    got[1] = np.array([[11], [8]])
    got[2] = np.array([[2.6, 3.0], [4.0, 4.0]], np.float32)
    assert compare_fastpitch(got, want, TOL)[0] == float("inf")


def test_values_past_an_items_length_fail():
    want = outputs([10, 8], [[2.0, 3.0], [4.0, 4.0]])
    got = [x.copy() for x in want]
    got[0][1, :, 9] = 1.0
    assert compare_fastpitch(got, want, TOL)[0] == float("inf")
