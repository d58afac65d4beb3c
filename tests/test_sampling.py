"""Host sampling: parameter checks and each filter's effect on Gaussian logits."""

import numpy as np
import pytest

from impnb.errors import ParameterError
from impnb.sampling import Sampler, SamplingParams, apply_penalties, apply_repeat_penalty, filter_probs


def logits(seed=0, n=1000, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(min_p=-0.1), dict(top_k=-1), dict(repeat_penalty=0.0),
                                 dict(seed=-1), dict(temperature=float("nan")), dict(presence_penalty=2.5),
                                 dict(frequency_penalty=-2.1), dict(presence_penalty=float("nan")),
                                 dict(frequency_penalty="1")])
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ParameterError):
        SamplingParams(**bad).validate()


def test_greedy_is_argmax():
    for seed in range(5):
        x = logits(seed)
        assert Sampler(SamplingParams(temperature=0))(x) == int(np.argmax(x))


def test_top_k_keeps_the_k_largest():
    x = logits(1)
    ids, probs = filter_probs(x, SamplingParams(top_k=7, top_p=1.0, min_p=0.0, temperature=1.0))
    assert set(ids) == set(np.argsort(-x)[:7])
    assert probs.sum() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_nucleus():
    x = logits(2, scale=1.0)
    ids, probs = filter_probs(x, SamplingParams(top_k=0, top_p=0.5, min_p=0.0, temperature=1.0))
    full = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    mass = full[ids].sum()
    assert mass >= 0.5 and mass - full[ids[-1]] < 0.5


def test_min_p_drops_unlikely_tokens():
    x = logits(3)
    ids, probs = filter_probs(x, SamplingParams(top_k=0, top_p=1.0, min_p=0.2, temperature=1.0))
    full = np.exp(x - x.max())
    assert np.all(full[ids] >= 0.2 - 1e-6)
    assert len(ids) < len(x)


def test_temperature_sharpens_and_flattens():
    x = logits(4, scale=1.0)
    p = dict(top_k=0, top_p=1.0, min_p=0.0)
    _, cold = filter_probs(x, SamplingParams(temperature=0.3, **p))
    _, hot = filter_probs(x, SamplingParams(temperature=3.0, **p))
    assert cold[0] > hot[0]


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    x = logits(5, n=8, scale=1.0)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    a = [Sampler(params)(x) for _ in range(3)]
    assert len(set(a)) == 1
    s = Sampler(params)
    counts = np.bincount([s(x) for _ in range(4000)], minlength=8) / 4000
    expected = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    assert np.abs(counts - expected).max() < 0.04


def test_repeat_penalty():
    x = np.array([2.0, -2.0, 1.0], np.float32)
    out = apply_repeat_penalty(x, [0, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]


def test_presence_and_frequency_penalties_follow_openais_formula():
    """logit[j] -= count[j] * frequency + (count[j] > 0) * presence over the window, after the
    repetition penalty (llama.cpp's order)."""
    x = logits(3, n=12)
    window = [4, 4, 4, 7, 0, 7, 11]
    p = SamplingParams(repeat_penalty=1.25, presence_penalty=0.75, frequency_penalty=-0.5)
    out = apply_penalties(x, window, p)
    count = np.bincount(window, minlength=12)
    y = apply_repeat_penalty(x, window, 1.25).astype(np.float64)
    want = y - count * -0.5 - (count > 0) * 0.75
    assert np.allclose(out, want, rtol=0, atol=1e-6)
    assert np.array_equal(out[count == 0], x[count == 0])
    assert p.penalized and not SamplingParams().penalized
    assert apply_penalties(x, [], p) is x


def test_a_presence_penalty_steers_the_greedy_choice():
    x = np.array([3.0, 2.5, 0.0], np.float32)
    assert Sampler(SamplingParams(temperature=0))(x, [0]) == 0
    assert Sampler(SamplingParams(temperature=0, presence_penalty=1.0))(x, [0]) == 1
    assert Sampler(SamplingParams(temperature=0, frequency_penalty=0.3))(x, [0, 0]) == 1
    assert Sampler(SamplingParams(temperature=0, frequency_penalty=0.3))(x, [0]) == 0
