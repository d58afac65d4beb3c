"""numpy twins of the Gated DeltaNet kernels in their layouts (rows of B sequences, state slots),
built on models/deltanet.py's reference; kept free of numba.

Legend: B sequences, T rows a sequence (R = B T rows, sequence by sequence), C conv channels
(Q, K, V), K conv width, Hk QK heads, Hv V heads, dk / dv head dims, n_slots state slots.
A sequence's slot -1 marks padding: its rows read and write no state and output zeros; tokens at
and past its length (lengths, when given) likewise. With pos (the rows' positions) a sequence's
state is the slot pair slots[b], slots[b] + 1: read at its first row's position's parity, written
at that of the position after its last real row.
"""

import numpy as np

from impnb.kernels.elementwise.reference import rms_norm_ref
from impnb.models.deltanet import (causal_conv1d, delta_rule_recurrent, l2_normalize, sigmoid, silu,
                                   softplus)


def _lengths(slots: np.ndarray, T: int, lengths) -> np.ndarray:
    return np.full(slots.shape, T) if lengths is None else np.minimum(lengths, T)


def _pair(slot: int, s: int, T: int, n: int, pos) -> tuple[int, int]:
    """(the slot read, the slot written) of sequence s's n real rows of T."""
    if pos is None:
        return slot, slot
    p0 = int(pos[s * T])
    return slot + p0 % 2, slot + (p0 + n) % 2


def conv1d_ref(x, weight, state, slots, lengths=None, pos=None) -> np.ndarray:
    """silu(causal depthwise conv) of x (R, C) with weight (C, K) -> out (R, C); state
    (n_slots, C, K-1) updated in place at slots (B,)."""
    B = slots.shape[0]
    T = x.shape[0] // B
    out = np.zeros(x.shape, np.float32)
    for s, (slot, n) in enumerate(zip(slots, _lengths(slots, T, lengths))):
        if slot >= 0:
            rows = slice(s * T, s * T + n)
            src, dst = _pair(slot, s, T, n, pos)
            out[rows], state[dst] = causal_conv1d(x[rows], weight, state[src])
    return out


def head_map(n_v_heads: int, n_k_heads: int, v_tiled: bool) -> np.ndarray:
    """The QK head each V head reads: h % Hk (tiled) or h // (Hv / Hk) (grouped)."""
    h = np.arange(n_v_heads)
    return h % n_k_heads if v_tiled else h // (n_v_heads // n_k_heads)


def gdn_ref(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps: float, state, slots, n_k_heads: int,
            v_tiled: bool, lengths=None, pos=None) -> np.ndarray:
    """A Gated DeltaNet layer after its conv, token by token: qkv (R, C) the conv's output
    ([q (Hk dk), k (Hk dk), v (Hv dv)] a row), z (R, Hv dv), b, a (R, Hv); ssm_a, dt_bias (Hv,),
    norm_w (dv,) -> rms_norm(o) * norm_w * silu(z) (R, Hv dv); state (n_slots, Hv, dk, dv) float32
    updated in place at slots (B,)."""
    _, Hv, dk, dv = state.shape
    B = slots.shape[0]
    R = qkv.shape[0]
    T = R // B
    heads = head_map(Hv, n_k_heads, v_tiled)
    n_qk = n_k_heads * dk
    q = l2_normalize(qkv[:, :n_qk].reshape(R, n_k_heads, dk))[:, heads] * np.float32(dk ** -0.5)
    k = l2_normalize(qkv[:, n_qk:2 * n_qk].reshape(R, n_k_heads, dk))[:, heads]
    v = qkv[:, 2 * n_qk:].reshape(R, Hv, dv)
    g = (ssm_a * softplus(a + dt_bias)).astype(np.float32)
    beta = sigmoid(b)
    out = np.zeros((R, Hv * dv), np.float32)
    for s, (slot, n) in enumerate(zip(slots, _lengths(slots, T, lengths))):
        if slot >= 0:
            rows = slice(s * T, s * T + n)
            src, dst = _pair(slot, s, T, n, pos)
            S = state[src].copy()
            o = delta_rule_recurrent(q[rows], k[rows], v[rows], g[rows], beta[rows], S)
            state[dst] = S
            gated = rms_norm_ref(o, norm_w, eps) * silu(z[rows].reshape(-1, Hv, dv))
            out[rows] = gated.reshape(-1, Hv * dv)
    return out
