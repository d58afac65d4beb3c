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
from impnb.models.deltanet import (CHUNK, causal_conv1d, delta_rule_recurrent, l2_normalize, sigmoid,
                                   silu, softplus)


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
    scale = np.float32(state.shape[2] ** -0.5)
    rule = lambda q, k, v, g, beta, S: delta_rule_recurrent(q * scale, k, v, g, beta, S)  # noqa: E731
    return _gdn(rule, qkv, z, b, a, ssm_a, dt_bias, norm_w, eps, state, slots, n_k_heads, v_tiled, lengths, pos)


def gdn_chunked_ref(qkv, z, b, a, ssm_a, dt_bias, norm_w, eps: float, state, slots, n_k_heads: int,
                    v_tiled: bool, lengths=None, pos=None, chunk: int = CHUNK, operand=np.float32) -> np.ndarray:
    """gdn_ref in chunks of `chunk` tokens as gdn_chunked.py computes it (delta_rule_wy), the
    tensor-core operands rounded to `operand` (np.float16: the kernel's) and everything else float32."""
    scale = np.float32(state.shape[2] ** -0.5)
    rule = lambda q, k, v, g, beta, S: delta_rule_wy(q, k, v, g, beta, S, scale, chunk, operand)  # noqa: E731
    return _gdn(rule, qkv, z, b, a, ssm_a, dt_bias, norm_w, eps, state, slots, n_k_heads, v_tiled, lengths, pos)


def delta_rule_wy(q, k, v, g, beta, state, q_scale, chunk: int = CHUNK, operand=np.float32) -> np.ndarray:
    """The gated delta rule a chunk of L tokens at a time, in the form gdn_chunked.py's kernel takes:
    q, k (T, H, dk) L2-normalised (q not yet scaled), v (T, H, dv), g, beta (T, H); state S (H, dk,
    dv) float32 updated in place -> o (T, H, dv). Per chunk, with c the cumulative sum of g over it
    (log of the decay from the chunk's start), D_ij = exp(c_i - c_j) and e = exp(c):
        A = strictly_lower(beta_i k_i·k_j D_ij),  Tm = (I + A)^-1            (the UT transform)
        v_new = Tm (beta (v - e (K S))) = U - W S,  U = Tm (beta v),  W = Tm (beta e K)
        o = q_scale (e (Q S) + (lower(Q Kᵀ) D) v_new)
        S = exp(c_L) S + (K exp(c_L - c))ᵀ v_new
    Every matrix a product reads is rounded to `operand` first, as the kernel rounds to fp16 (U,
    a product's result that no product reads, stays float32)."""
    rd = lambda x: x.astype(operand).astype(np.float32)  # noqa: E731
    out = np.empty(v.shape, np.float32)
    for c0 in range(0, q.shape[0], chunk):
        sl = slice(c0, c0 + chunk)
        qc, kc, vc = (x[sl].transpose(1, 0, 2) for x in (q, k, v))  # (H, L, d)
        c = np.cumsum(g[sl].T, axis=-1, dtype=np.float32)          # (H, L)
        bc = beta[sl].T[:, :, None]                                # (H, L, 1)
        L = qc.shape[1]
        strict, lower = np.tri(L, k=-1, dtype=bool), np.tri(L, dtype=bool)
        D = np.exp(np.where(lower, c[:, :, None] - c[:, None, :], 0)).astype(np.float32)
        qn, kn = rd(qc), rd(kc)
        A = np.where(strict, bc * (kn @ kn.transpose(0, 2, 1)) * D, 0)
        Tm = rd(np.linalg.inv(np.eye(L) + A.astype(np.float64)).astype(np.float32))
        P = rd(np.where(lower, (qn @ kn.transpose(0, 2, 1)) * D, 0))
        e = np.exp(c)[:, :, None]
        Sh = rd(state)
        U = Tm @ rd(bc * vc)
        W = rd(Tm @ rd(bc * e * kc))
        v_new = rd(U - W @ Sh)
        o = ((qn @ Sh) * e + P @ v_new) * q_scale
        out[sl] = o.transpose(1, 0, 2)
        last = c[:, -1:]
        k_end = rd(kc * np.exp(last - c)[:, :, None])
        state *= np.exp(last)[:, :, None]
        state += k_end.transpose(0, 2, 1) @ v_new
    return out


def _gdn(rule, qkv, z, b, a, ssm_a, dt_bias, norm_w, eps, state, slots, n_k_heads, v_tiled, lengths, pos):
    """The layout around a delta rule rule(q, k, v, g, beta, S) (q normalised, not scaled)."""
    _, Hv, dk, dv = state.shape
    B = slots.shape[0]
    R = qkv.shape[0]
    T = R // B
    heads = head_map(Hv, n_k_heads, v_tiled)
    n_qk = n_k_heads * dk
    q = l2_normalize(qkv[:, :n_qk].reshape(R, n_k_heads, dk))[:, heads]
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
            o = rule(q[rows], k[rows], v[rows], g[rows], beta[rows], S)
            state[dst] = S
            gated = rms_norm_ref(o, norm_w, eps) * silu(z[rows].reshape(-1, Hv, dv))
            out[rows] = gated.reshape(-1, Hv * dv)
    return out
