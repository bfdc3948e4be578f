"""The feature backlog: target features an EAGLE head has not been handed yet, across rounds and calls."""

from __future__ import annotations

import numpy as np

from eagle2_local.decoding.backlog import FeatureBacklog


def rows(start: int, n: int) -> np.ndarray:
    """Feature rows whose value is their position, so a test can read which positions a backlog holds."""
    return np.arange(start, start + n, dtype=np.float32)[:, None].repeat(3, axis=1)


def test_rounds_and_plain_steps_gather_consecutive_rows():
    b = FeatureBacklog()
    assert b.take() == (None, 0)
    b.restart(rows(10, 3), at=10)  # a tree round committed positions 10..12
    b.extend(rows(13, 1))  # plain steps the draft sat out
    b.extend(rows(14, 1))
    got, start = b.take()
    assert start == 10 and b.end == 15
    np.testing.assert_array_equal(got[:, 0], np.arange(10, 15))
    b.restart(None, at=15)  # a target without features: nothing is gathered
    b.extend(rows(15, 1))
    assert b.take() == (None, 15)


def test_a_new_prompt_keeps_the_rows_the_engine_never_got():
    b = FeatureBacklog()
    b.restart(rows(10, 5), at=10)
    # the head holds features up to 10: a prompt reusing 13 tokens keeps them (rows 10..12 are still here)
    assert b.reusable(13, engine_has=10) == 13
    b.trim(13, rows(13, 4))  # the prefill computed positions 13..16
    got, start = b.take()
    assert start == 10
    np.testing.assert_array_equal(got[:, 0], np.arange(10, 17))
    # the head holds features up to 4 only and the backlog starts at 10: text 4..9 must be re-evaluated
    assert b.reusable(12, engine_has=4) == 4
    assert b.reusable(30, engine_has=4) == 4  # past the backlog: only what the head holds counts
    assert b.reusable(30, engine_has=30) == 30
    b.trim(4, rows(4, 3))  # cut before the backlog: it restarts at the cut
    got, start = b.take()
    assert start == 4
    np.testing.assert_array_equal(got[:, 0], [4, 5, 6])
