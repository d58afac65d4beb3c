"""Sampling kernels on the GPU: Philox, argmax, repetition penalty and the sampled token.

The check_* functions run one case (fresh Gaussian logits, ids poisoned with -1, scratch with
garbage and NaN); tests/sim/test_sample.py runs the same checks on tiny vocabularies.

Exactness: argmax and the penalty are exact. A sampled token must equal sample_ref's (the host
filter_probs distribution, inverse CDF in its order at the kernel's Philox uniform); where the
two differ, only float64 rounding may explain it: the token must be the host's pick with top_p,
min_p or the uniform moved by 1e-9 (relative). Empirical frequencies of 4000 draws are within
0.04 of filter_probs' probabilities.
"""

import dataclasses

import numpy as np
import pytest
from numba import cuda

from impnb.kernels.sample.argmax import argmax, argmax_scratch
from impnb.kernels.sample.philox import _philox4x32, philox_uniform, philox4x32_ref, uniform_ref
from impnb.kernels.sample.sample import sample, sample_params, sample_ref, sample_scratch
from impnb.kernels.sample.sample_penalty import push_history, repeat_penalty
from impnb.kernels.sample.sample_select import NT, pick_bin
from impnb.sampling import SamplingParams, apply_penalties, filter_probs

pytestmark = pytest.mark.gpu

M = 0xFFFFFFFF
PI_CTR, PI_KEY = [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]
PHILOX_KAT = [  # Random123 kat_vectors: rounds, counter, key -> output
    (7, [0] * 4, [0] * 2, [0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48]),
    (7, [M] * 4, [M] * 2, [0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662]),
    (7, PI_CTR, PI_KEY, [0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A]),
    (10, [0] * 4, [0] * 2, [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    (10, [M] * 4, [M] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (10, PI_CTR, PI_KEY, [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]
CONFIGS = [  # rows of the sampling checks
    SamplingParams(temperature=0.0),                                             # greedy
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1),   # llama.cpp's
    SamplingParams(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0, seed=2),      # full-vocab top-p
    SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.05, seed=3),     # full-vocab min-p
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=2**40 + 5),  # softmax
    SamplingParams(temperature=0.7, top_k=256, top_p=1.0, min_p=0.0, seed=4),    # largest top-k
    SamplingParams(temperature=1.2, top_k=5, top_p=0.5, min_p=0.2, seed=5),
    SamplingParams(temperature=0.5, top_k=0, top_p=0.95, min_p=0.01, seed=6, repeat_penalty=1.3),
    SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.0, seed=7, presence_penalty=1.5,
                   frequency_penalty=0.5),
]


def gauss(rng, shape, std) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


@cuda.jit
def _philox_kernel(ctr, key, rounds, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        x = _philox4x32(ctr[i, 0], ctr[i, 1], ctr[i, 2], ctr[i, 3], key[i, 0], key[i, 1], rounds[i])
        for j in range(4):
            out[i, j] = x[j]


@cuda.jit
def _uniform_kernel(seed, seq, step, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = philox_uniform(seed[i, 0], seed[i, 1], seq[i], step[i])


@cuda.jit
def _pick_bin_kernel(hist_w, hist_c, targets, strict, buf, state, out):
    for i in range(targets.shape[0]):
        nb = hist_w.shape[0]
        d, above, cnt = pick_bin(hist_w, hist_c, nb, targets[i], strict[i], buf, state)
        if cuda.threadIdx.x == 0:
            out[i, 0] = d
            out[i, 1] = above
            out[i, 2] = cnt


def pick_bin_ref(w, c, target, strict):
    """Bins from the top: the first non-empty one whose running weight reaches (passes) target;
    past the total, the last bin with weight."""
    acc, last = 0.0, None
    for d in range(len(w) - 1, -1, -1):
        if c[d] > 0:
            if (acc + w[d] > target) if strict else (acc + w[d] >= target):
                return d, acc, c[d]
            if w[d] > 0:
                last = (d, acc, c[d])
            acc += w[d]
    return last


def acceptable(x, history, p, seq, step, eps=1e-9) -> set:
    """sample_ref's pick and the picks with top_p, min_p and the uniform moved by eps."""
    seen = [int(h) for h in history if 0 <= h < len(x)]
    y = apply_penalties(x, seen, p)
    u = uniform_ref(p.seed, seq, step)
    picks = set()
    for dp in (-eps, 0, eps):
        for dm in (-eps, 0, eps):
            q = dataclasses.replace(p, top_p=min(1.0, p.top_p * (1 + dp)), min_p=p.min_p * (1 + dm))
            ids, probs = filter_probs(y, q)
            cdf = np.cumsum(probs) / probs.sum()
            for du in (-eps, 0, eps):
                i = int(np.searchsorted(cdf, u * (1 + du), side="right"))
                picks.add(int(ids[min(i, len(ids) - 1)]))
    return picks


# ---------------------------------------------------------------- inputs

def tie_plateau(V, B):
    """One logit at 2, 60% of the row at exactly 0, the rest at -1: top-p 0.5 cuts the plateau."""
    x = np.full((B, V), -1.0, np.float32)
    for b in range(B):
        x[b, np.random.default_rng(b).permutation(V)[: V * 3 // 5]] = 0.0
        x[b, V // 3 + b] = 2.0
    return x


PLATEAU_CONFIGS = [SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, seed=8),
                   SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.2, seed=9)]


def min_p_edge(V):
    """Rows with one logit just inside min-p 0.1's cut (e = 0.1 (1 + 1e-4)), one just outside;
    row 0 has few logits above the cut (the best 256 settle it), row 1 ~30% of V (they do not)."""
    rng = np.random.default_rng(V)
    x = np.minimum(np.stack([gauss(rng, V, 1.0) - 4, gauss(rng, V, 1.3)]), 2.5)
    for row in x:
        row[(row > 0.69) & (row < 0.71)] = 0.75  # nothing else near the cut
        row[V // 2] = np.float32(3.0 + np.log(0.1) + 1e-4)
        row[V // 5] = np.float32(3.0 + np.log(0.1) - 1e-4)
        row[V // 7] = 3.0
    return x


MIN_P_CONFIGS = [SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1, seed=12),
                 SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1, seed=13)]


def history_for(rng, x, H=16):
    """A ring per row: ids among the row's 8 largest (repeats included) and empty slots (-1)."""
    hist = np.full((x.shape[0], H), -1, np.int32)
    for b in range(x.shape[0]):
        top = np.argsort(-x[b], kind="stable")[:8]
        hist[b, : H - 4] = rng.choice(top, H - 4)
    return hist


def poisoned_scratch(rng, B, V):
    scratch = sample_scratch(B, V)
    shape = scratch.cand_idx.shape
    scratch.cand_bits.copy_to_device(rng.integers(-2**31, 2**31, shape, dtype=np.int32))
    scratch.cand_idx.copy_to_device(rng.integers(-2**31, 2**31, shape, dtype=np.int32))
    scratch.stats.copy_to_device(np.full(scratch.stats.shape, np.nan))
    return scratch


def late_steps(configs, lo=0.9999):
    """Per row, a step whose uniform is >= lo: the draw is the last kept candidate or near it,
    so a top-k / top-p / min-p cut that is off by one token changes the pick."""
    steps = np.arange(200_000, dtype=np.uint64)
    picked = []
    for p in configs:  # the counter is (step, 0, 0, 0): a row's place in the batch is not in it
        ctr = np.stack([steps, 0 * steps, 0 * steps, 0 * steps], -1)
        x = philox4x32_ref(ctr, [p.seed & M, p.seed >> 32]).astype(np.float64)
        u = (np.floor(x[:, 0] / 32) * 2.0**26 + np.floor(x[:, 1] / 64)) / 2.0**53
        picked.append(int(np.argmax(u >= lo)))
        assert uniform_ref(p.seed, 0, picked[-1]) >= lo
    return picked


# ---------------------------------------------------------------- checks

def check_philox():
    for rounds, ctr, key, want in PHILOX_KAT:
        assert philox4x32_ref(ctr, key, rounds).tolist() == want, (rounds, ctr, key)
    ctr = np.array([c for _, c, _, _ in PHILOX_KAT], np.int64)
    key = np.array([k for _, _, k, _ in PHILOX_KAT], np.int64)
    rounds = np.array([r for r, _, _, _ in PHILOX_KAT], np.int64)
    out = np.full((len(PHILOX_KAT), 4), -1, np.int64)
    d_out = cuda.to_device(out)
    _philox_kernel[1, 32](cuda.to_device(ctr), cuda.to_device(key), cuda.to_device(rounds), d_out)
    assert d_out.copy_to_host().tolist() == [w for _, _, _, w in PHILOX_KAT]
    cases = [(0, 0, 0), (1, 3, 7), (2**40 + 5, 7, 123456), (2**64 - 1, 1, 2**31 - 1), (12345, 2, 1)]
    seed = np.array([[s & M, s >> 32] for s, _, _ in cases], np.int64)
    seq = np.array([q for _, q, _ in cases], np.int64)
    step = np.array([t for _, _, t in cases], np.int64)
    d_u = cuda.to_device(np.full(len(cases), np.nan))
    _uniform_kernel[1, 32](cuda.to_device(seed), cuda.to_device(seq), cuda.to_device(step), d_u)
    assert d_u.copy_to_host().tolist() == [uniform_ref(*c) for c in cases]


def check_pick_bin(rng, nb=2048):
    """The radix step on a sparse histogram with integer weights (exact sums), zero-weight
    non-empty bins (underflowed logits), targets on bin edges and past the total."""
    c = np.where(rng.random(nb) < 0.05, rng.integers(1, 4, nb), 0).astype(np.int32)
    w = (c * rng.integers(0, 3, nb)).astype(np.float64)
    run = np.cumsum(w[::-1])
    targets = [0.0, 1.0, run[-1], run[-1] + 5.0, *rng.choice(run, 6), *rng.uniform(0, run[-1], 6)]
    strict = [i % 2 == 1 for i in range(len(targets))] + [False] * len(targets)
    targets = np.array(targets * 2)
    out = cuda.to_device(np.full((len(targets), 3), np.nan))
    _pick_bin_kernel[1, NT](cuda.to_device(w), cuda.to_device(c), cuda.to_device(targets),
                            cuda.to_device(np.array(strict)), cuda.to_device(np.zeros((2, NT))),
                            cuda.to_device(np.zeros(4)), out)
    got = out.copy_to_host()
    for i, (tg, st) in enumerate(zip(targets, strict)):
        assert tuple(got[i]) == pick_bin_ref(w, c, tg, st), (tg, st)


def check_argmax(rng, B, V, std, ties=False):
    """Two launches on fresh rows: the scratch the first one leaves must serve the second."""
    scratch = argmax_scratch(B)
    stream = cuda.stream()
    for _ in range(2):
        x = gauss(rng, (B, V), std)
        if ties:  # the row's max at three places (one near the end): the lowest id wins
            for b in range(B):
                at = np.sort(rng.choice(V, size=min(3, V), replace=False))
                at[-1] = V - 1
                x[b, at] = x[b].max() + 1
        d_out = cuda.to_device(np.full(B, -1, np.int32))
        argmax(cuda.to_device(x, stream=stream), d_out, scratch, stream)
        got = d_out.copy_to_host(stream=stream)
        stream.synchronize()
        assert got.tolist() == np.argmax(x, axis=1).tolist()


PENALTIES = [  # (repetition, presence, frequency) of the penalty checks' rows
    (1.3, 0.0, 0.0), (1.0, 0.0, 0.0), (0.7, 0.0, 0.0), (2.0, 0.0, 0.0),
    (1.0, 0.5, 0.0), (1.0, 0.0, 0.3), (1.1, -1.7, 0.1), (1.0, 0.31, -1.93),
]


def check_penalty(rng, B, V, std, penalties=PENALTIES):
    """Every row's logits after the kernel equal apply_penalties' bit for bit (rings with repeats)."""
    x = gauss(rng, (B, V), std)
    hist = history_for(rng, x)
    ps = [SamplingParams(repeat_penalty=r, presence_penalty=pr, frequency_penalty=fr)
          for r, pr, fr in (penalties[b % len(penalties)] for b in range(B))]
    d_x = cuda.to_device(x)
    stream = cuda.stream()
    repeat_penalty(d_x, cuda.to_device(hist), cuda.to_device(sample_params(ps)), stream)
    got = d_x.copy_to_host(stream=stream)
    stream.synchronize()
    for b in range(B):
        seen = [int(h) for h in hist[b] if h >= 0]
        want = apply_penalties(x[b], seen, ps[b])
        assert np.array_equal(got[b], want), b
        assert np.array_equal(want, x[b]) == (not ps[b].penalized)


def check_push_history(B, H=5, steps=(0, 3, 9)):
    d_hist = cuda.to_device(np.full((B, H), -1, np.int32))
    ref = np.full((B, H), -1, np.int32)
    stream = cuda.stream()
    for s in steps:
        ids = (np.arange(B) * 10 + s).astype(np.int32)
        push_history(cuda.to_device(ids), cuda.to_device(np.array([s], np.int32)), d_hist, stream)
        ref[:, s % H] = ids
    assert np.array_equal(d_hist.copy_to_host(stream=stream), ref)


def check_sample(rng, V, std, configs, steps=(0, 7, 123456), ties=False, x=None):
    """Penalty then sample for rows with their own configs (logits x, else Gaussian); every
    token against sample_ref. A step is one int (a (1,) step array) or one per row ((B,))."""
    B = len(configs)
    rng = rng or np.random.default_rng(V)
    x = gauss(rng, (B, V), std) if x is None else x
    if ties:  # multiples of 0.5: ties at the top-k / top-p cuts and inside the draw
        x = (np.round(x * 2) / 2).astype(np.float32)
    hist = history_for(rng, x)
    d_params, d_hist = cuda.to_device(sample_params(configs)), cuda.to_device(hist)
    scratch = poisoned_scratch(rng, B, V)
    stream = cuda.stream()
    for s in steps:
        step = np.array(s, np.int32).reshape(-1)
        d_x, d_out = cuda.to_device(x, stream=stream), cuda.to_device(np.full(B, -1, np.int32))
        repeat_penalty(d_x, d_hist, d_params, stream)
        sample(d_x, d_params, cuda.to_device(step), d_out, scratch, stream)
        got = d_out.copy_to_host(stream=stream)
        stream.synchronize()
        for b, p in enumerate(configs):
            at = int(step[b if len(step) > 1 else 0])
            want = sample_ref(x[b], hist[b], p, at)
            if got[b] != want:
                assert got[b] in acceptable(x[b], hist[b], p, 0, at), (b, p, at, got[b], want)


def check_distribution(x, p, rows=1000, steps=4):
    """rows * steps draws from one row of logits against filter_probs; returns (freq, probs)."""
    V = x.shape[0]
    d_x = cuda.to_device(np.tile(x, (rows, 1)))
    d_params = cuda.to_device(sample_params([dataclasses.replace(p, seed=p.seed + r) for r in range(rows)]))
    scratch = sample_scratch(rows, V)
    d_out = cuda.to_device(np.full(rows, -1, np.int32))
    stream = cuda.stream()
    counts = np.zeros(V)
    for s in range(steps):
        sample(d_x, d_params, cuda.to_device(np.array([s], np.int32)), d_out, scratch, stream)
        got = d_out.copy_to_host(stream=stream)
        stream.synchronize()
        assert got.min() >= 0
        counts += np.bincount(got, minlength=V)
    ids, probs = filter_probs(x, p)
    expected = np.zeros(V)
    expected[ids] = probs
    freq = counts / (rows * steps)
    assert set(np.flatnonzero(counts)) <= set(ids.tolist())
    assert np.abs(freq - expected).max() < 0.04
    return freq, expected


# ---------------------------------------------------------------- GPU tests

def test_philox_known_answers():
    check_philox()


def test_pick_bin():
    check_pick_bin(np.random.default_rng(2048))


@pytest.mark.parametrize("ties", (False, True))
@pytest.mark.parametrize("std", (1.0, 10.0))
@pytest.mark.parametrize("B", (1, 4))
@pytest.mark.parametrize("V", (49152, 262144, 989))
def test_argmax(V, B, std, ties):
    check_argmax(np.random.default_rng([V, B, int(std), ties]), B, V, std, ties)


@pytest.mark.parametrize("V", (49152, 262144))
def test_repeat_penalty_and_history(V):
    check_penalty(np.random.default_rng(V), len(PENALTIES), V, 3.0)
    check_push_history(4)


@pytest.mark.parametrize("std", (1.0, 10.0))
@pytest.mark.parametrize("V", (49152, 262144))
def test_sample_batch_of_4(V, std):
    rng = np.random.default_rng([V, int(std), 4])
    check_sample(rng, V, std, CONFIGS[:4], steps=(0, 7, late_steps(CONFIGS[:4])))
    check_sample(rng, V, std, CONFIGS[4:],
                 steps=(3 + np.arange(len(CONFIGS[4:])), 123456, late_steps(CONFIGS[4:])))


@pytest.mark.parametrize("std", (1.0, 10.0))
@pytest.mark.parametrize("V", (49152, 262144))
def test_sample_batch_of_1(V, std):
    rng = np.random.default_rng([V, int(std), 1])
    for p in CONFIGS:
        check_sample(rng, V, std, [p], steps=(0, 99, late_steps([p])))


def test_sample_row_does_not_depend_on_its_batch():
    """A sequence's token is the same alone and at any row of a batch of others (its seed and
    step decide the draw): what continuous batching needs for reproducible seeded sampling."""
    V, rng = 49152, np.random.default_rng(11)
    x = gauss(rng, (6, V), 2.0)
    configs = [dataclasses.replace(c, repeat_penalty=1.0) for c in CONFIGS[:6]]
    stream = cuda.stream()

    def picks(rows, steps):
        d_out = cuda.to_device(np.full(len(rows), -1, np.int32))
        sample(cuda.to_device(x[rows]), cuda.to_device(sample_params([configs[r] for r in rows])),
               cuda.to_device(np.asarray(steps, np.int32)), d_out, poisoned_scratch(rng, len(rows), V), stream)
        out = d_out.copy_to_host(stream=stream)
        stream.synchronize()
        return out

    alone = {r: picks([r], [5 + r])[0] for r in range(6)}
    order = [3, 0, 5, 1, 4, 2]
    together = picks(order, [5 + r for r in order])
    assert [alone[r] for r in order] == together.tolist()


@pytest.mark.parametrize("V", (19, 111, 989, 49152))
def test_sample_ties_and_odd_sizes(V):
    rng = np.random.default_rng([V, 7])
    check_sample(rng, V, 3.0, CONFIGS, steps=(0, late_steps(CONFIGS)), ties=True)
    check_sample(rng, V, 1.0, CONFIGS, steps=(1, late_steps(CONFIGS)), ties=True)  # few values


@pytest.mark.parametrize("V", (1000, 49152, 262144))
def test_sample_min_p_edge(V):
    check_sample(None, V, 0.0, MIN_P_CONFIGS, steps=(0, late_steps(MIN_P_CONFIGS)),
                 x=min_p_edge(V))


@pytest.mark.parametrize("V", (1000, 49152))
def test_sample_tie_plateau(V):
    check_sample(None, V, 0.0, PLATEAU_CONFIGS, steps=(0, 1, late_steps(PLATEAU_CONFIGS)),
                 x=tie_plateau(V, 2))


@pytest.mark.parametrize("V", (49152, 262144))
def test_greedy_is_argmax(V):
    rng = np.random.default_rng(V)
    x = gauss(rng, (4, V), 1.0)
    d_x = cuda.to_device(x)
    d_a, d_s = cuda.to_device(np.full(4, -1, np.int32)), cuda.to_device(np.full(4, -1, np.int32))
    params = cuda.to_device(sample_params([SamplingParams(temperature=0.0, seed=b)
                                           for b in range(4)]))
    stream = cuda.stream()
    argmax(d_x, d_a, argmax_scratch(4), stream)
    sample(d_x, params, cuda.to_device(np.array([3], np.int32)), d_s, sample_scratch(4, V), stream)
    stream.synchronize()
    assert d_s.copy_to_host().tolist() == d_a.copy_to_host().tolist() == np.argmax(x, 1).tolist()


@pytest.mark.parametrize("p", [CONFIGS[4], CONFIGS[1], CONFIGS[6], SamplingParams(
    temperature=1.3, top_k=0, top_p=0.8, min_p=0.1, seed=9)])
def test_distribution_small_vocab(p):
    check_distribution(gauss(np.random.default_rng(50), 50, 1.0), p)


def test_distribution_full_vocab_path():
    """3 large logits over a flat tail of 997: the nucleus needs ~900 ids, past the best 256."""
    rng = np.random.default_rng(1000)
    x = gauss(rng, 1000, 0.1)
    x[[5, 500, 999]] = 3.0
    p = SamplingParams(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0, seed=11)
    freq, probs = check_distribution(x, p)
    ids, _ = filter_probs(x, p)
    assert len(ids) > 800
    for part in ([5, 500, 999], ids[3:256], ids[256:]):  # the head; and the tail in and past
        assert abs(freq[part].sum() - probs[part].sum()) < 0.04  # the best 256
