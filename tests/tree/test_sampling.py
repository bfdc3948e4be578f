"""The warpers shared by plain and speculative decoding."""

from __future__ import annotations

import numpy as np
import pytest

from eagle2_local.errors import Eagle2Error
from eagle2_local.tree.sampling import SamplingParams, sample_from


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


def test_a_steps_recent_text_penalizes_as_the_whole_text_does():
    """A decoding step hands the penalty only the text's last repeat_last_n tokens (``recent``), not the whole
    text: the same warped logits, with and without a penalty, with a token appended or not, short texts too, the
    text a list or an array."""
    rng = np.random.default_rng(5)
    logits = rng.normal(size=300).astype(np.float32)
    for penalty, last_n in ((1.0, 64), (1.3, 64), (0.8, 5), (1.3, 0), (1.1, 1)):
        params = SamplingParams(temperature=0.0, repeat_penalty=penalty, repeat_last_n=last_n)
        for length in (0, 1, 4, 5, 6, 63, 64, 65, 400):
            text = rng.integers(0, 300, length).tolist()
            for last in (None, int(rng.integers(0, 300))):
                whole = np.asarray(text if last is None else text + [last])
                expected = params.penalized(logits, whole)
                assert np.array_equal(params.penalized(logits, params.recent(text, last)), expected)
                assert np.array_equal(params.penalized(logits, params.recent(np.asarray(text), last)), expected)


@pytest.mark.parametrize("temperature", [1e-308, 5e-324, 5e-5])
def test_a_temperature_below_the_floor_is_greedy(temperature):
    """Dividing logits by 1e-308 overflows to inf and the distribution to NaN (the last token of the vocabulary
    every step): below MIN_TEMPERATURE the Python API and the CLI decode greedily, as the server does."""
    from eagle2_local.tree.sampling import MIN_TEMPERATURE
    logits = np.array([0.5, 3.0, -1.0, 2.9])
    params = SamplingParams(temperature=temperature, top_k=40)
    assert temperature < MIN_TEMPERATURE and params.greedy
    np.testing.assert_array_equal(params.probs(logits), [0.0, 1.0, 0.0, 0.0])
    assert params.choose(logits, None, np.random.default_rng(0)) == 1
    assert not SamplingParams(temperature=MIN_TEMPERATURE).greedy


@pytest.mark.parametrize("penalty", [1e-320, 1e-4, 1e4, float("inf")])
def test_a_repeat_penalty_that_overflows_the_logits_is_refused(penalty):
    with pytest.raises(Eagle2Error, match="repeat_penalty"):
        SamplingParams(temperature=0.7, repeat_penalty=penalty)
