"""Gated DeltaNet's numpy reference (models/deltanet.py): the chunked delta rule equals the
token-by-token one, and the causal conv and both rules carry their state across calls, so a prompt
split anywhere gives what it gives whole."""

import numpy as np
import pytest

from impnb.models.config import DeltaNetShape
from impnb.models.deltanet import (causal_conv1d, delta_rule_chunked, delta_rule_recurrent,
                                   expand_heads, l2_normalize)

H, DK, DV = 3, 16, 24


def inputs(T: int, seed: int, decay: float = 1.0):
    """Normalised q (scaled) and k, v, log-decays g <= 0 and betas in (0, 1), and a random state."""
    rng = np.random.default_rng(seed)
    q = l2_normalize(rng.standard_normal((T, H, DK), dtype=np.float32)) * np.float32(DK ** -0.5)
    k = l2_normalize(rng.standard_normal((T, H, DK), dtype=np.float32))
    v = rng.standard_normal((T, H, DV), dtype=np.float32)
    g = (-decay * rng.exponential(size=(T, H))).astype(np.float32)
    beta = rng.uniform(0, 1, (T, H)).astype(np.float32)
    state = rng.standard_normal((H, DK, DV), dtype=np.float32)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("T,chunk", [(1, 64), (19, 64), (111, 64), (111, 16), (64, 64)])
@pytest.mark.parametrize("decay", [0.01, 1.0, 30.0])
def test_chunked_equals_recurrent(T, chunk, decay):
    q, k, v, g, beta, state = inputs(T, seed=T + chunk, decay=decay)
    s_rec, s_chunk = state.copy(), state.copy()
    o_rec = delta_rule_recurrent(q, k, v, g, beta, s_rec)
    o_chunk = delta_rule_chunked(q, k, v, g, beta, s_chunk, chunk)
    np.testing.assert_allclose(o_chunk, o_rec, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s_chunk, s_rec, rtol=1e-4, atol=1e-4)
    assert s_chunk.dtype == np.float32 and np.isfinite(o_chunk).all()


def test_one_step_is_the_delta_rule():
    """S *= exp(g); delta = (v - Sᵀk) beta; S += k deltaᵀ; o = Sᵀq, written out for one head."""
    q, k, v, g, beta, state = inputs(1, seed=3)
    expect_s = state[0] * np.exp(g[0, 0])
    delta = (v[0, 0] - expect_s.T @ k[0, 0]) * beta[0, 0]
    expect_s = expect_s + np.outer(k[0, 0], delta)
    out = delta_rule_recurrent(q, k, v, g, beta, state)
    np.testing.assert_allclose(state[0], expect_s, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[0, 0], expect_s.T @ q[0, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("split", [1, 2, 3, 5, 18])
def test_conv_and_rule_carry_state_across_calls(split):
    rng = np.random.default_rng(split)
    C, K, T = 7, 4, 19
    x = rng.standard_normal((T, C), dtype=np.float32)
    w = rng.standard_normal((C, K), dtype=np.float32)
    whole, state = causal_conv1d(x, w, np.zeros((C, K - 1), np.float32))
    first, mid = causal_conv1d(x[:split], w, np.zeros((C, K - 1), np.float32))
    rest, end = causal_conv1d(x[split:], w, mid)
    np.testing.assert_allclose(np.concatenate([first, rest]), whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(end, state)
    np.testing.assert_array_equal(state, x[-(K - 1):].T)  # the last K-1 inputs, channel-major

    q, k, v, g, beta, s0 = inputs(T, seed=split)
    s_whole = s0.copy()
    o_whole = delta_rule_chunked(q, k, v, g, beta, s_whole)
    s_split = s0.copy()
    o_split = np.concatenate([delta_rule_chunked(q[:split], k[:split], v[:split], g[:split], beta[:split], s_split)]
                             + [delta_rule_recurrent(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                                     beta[t:t + 1], s_split) for t in range(split, T)])
    np.testing.assert_allclose(o_split, o_whole, rtol=1e-4, atol=1e-4)


def test_causal_conv_first_token_sees_only_itself():
    x = np.zeros((3, 1), np.float32)
    x[0] = 1.0
    w = np.array([[0.5, 0.25, 0.125, 2.0]], np.float32)  # the last tap is the current token
    out, _ = causal_conv1d(x, w, np.zeros((1, 3), np.float32))
    pre = np.array([2.0, 0.125, 0.25])
    np.testing.assert_allclose(out[:, 0], pre / (1 + np.exp(-pre)), rtol=1e-6)


def test_v_heads_read_qk_heads_tiled_or_grouped():
    x = np.arange(2, dtype=np.float32).reshape(1, 2, 1)  # QK heads 0, 1
    shape = dict(n_k_heads=2, n_v_heads=6, head_k_dim=1, head_v_dim=1, conv_kernel=4, fused_ba=False)
    assert expand_heads(x, DeltaNetShape(**shape, v_tiled=True))[0, :, 0].tolist() == [0, 1, 0, 1, 0, 1]
    assert expand_heads(x, DeltaNetShape(**shape, v_tiled=False))[0, :, 0].tolist() == [0, 0, 0, 1, 1, 1]
