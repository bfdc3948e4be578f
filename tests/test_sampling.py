"""The warpers shared by plain and speculative decoding."""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local.decoding.sampling import SamplingParams, sample_from
from eagle2_local.errors import Eagle2Error


def test_greedy_is_one_hot_argmax():
    p = SamplingParams(temperature=0).probs(np.array([0.1, 3.0, 2.0]))
    assert p.tolist() == [0.0, 1.0, 0.0]


def test_temperature_softmax():
    logits = np.array([1.0, 2.0, 3.0])
    p = SamplingParams(temperature=2.0).probs(logits)
    expected = np.exp(logits / 2) / np.exp(logits / 2).sum()
    np.testing.assert_allclose(p, expected)


def test_top_k_top_p_min_p():
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1]))
    assert np.count_nonzero(SamplingParams(temperature=1, top_k=2).probs(logits)) == 2
    p = SamplingParams(temperature=1, top_p=0.7).probs(logits)
    np.testing.assert_allclose(p, [0.5 / 0.75, 0.25 / 0.75, 0, 0])
    p = SamplingParams(temperature=1, min_p=0.4).probs(logits)
    np.testing.assert_allclose(p, [0.5 / 0.75, 0.25 / 0.75, 0, 0])


def test_repetition_penalty_lowers_seen_tokens():
    logits = np.array([2.0, 2.0, -1.0])
    sp = SamplingParams(temperature=1, repeat_penalty=2.0)
    p = sp.probs(logits, history=np.array([0, 2]))
    assert p[0] < p[1]
    greedy = SamplingParams(temperature=0, repeat_penalty=2.0)
    assert greedy.choose(np.array([2.0, 1.5, -1.0]), np.array([0]), np.random.default_rng(0)) == 1
    assert greedy.choose(np.array([2.0, 1.5, -1.0]), np.array([2]), np.random.default_rng(0)) == 0


def test_sample_from_matches_distribution():
    p = np.array([0.2, 0.0, 0.5, 0.3])
    rng = np.random.default_rng(1)
    draws = np.bincount([sample_from(p, rng) for _ in range(20000)], minlength=4) / 20000
    assert draws[1] == 0
    np.testing.assert_allclose(draws, p, atol=0.015)


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(min_p=1.0),
                                dict(repeat_penalty=0)])
def test_invalid_params(kw):
    with pytest.raises(Eagle2Error):
        SamplingParams(**kw)


def test_repeat_last_n_zero_means_off():
    logits = np.array([2.0, 1.0])
    off = SamplingParams(temperature=1, repeat_penalty=2.0, repeat_last_n=0)
    np.testing.assert_allclose(off.probs(logits, history=np.array([0])), SamplingParams(temperature=1).probs(logits))
