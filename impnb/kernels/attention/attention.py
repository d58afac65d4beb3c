"""Causal attention with GQA and a sliding window: numpy reference."""

import numpy as np


def attention_mask(q_pos: np.ndarray, k_pos: np.ndarray, window: int | None) -> np.ndarray:
    """(T, S) bool, True where query at q_pos may see key at k_pos (causal, within window)."""
    rel = q_pos[:, None] - k_pos[None, :]
    mask = rel >= 0
    if window is not None:
        mask &= rel < window
    return mask


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray,
                  scale: float, window: int | None = None,
                  softcap: float | None = None) -> np.ndarray:
    """q (T, H, D), k/v (S, Hkv, D) for positions 0..S-1 -> (T, H, Dv) float32.

    Query head h reads KV head h // (H / Hkv). Softmax in float64.
    """
    T, H, _ = q.shape
    S, Hkv, _ = k.shape
    group = H // Hkv
    qg = q.reshape(T, Hkv, group, -1).astype(np.float64)
    scores = np.einsum("tkgd,skd->kgts", qg, k.astype(np.float64)) * scale  # (Hkv, g, T, S)
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    mask = attention_mask(q_pos, np.arange(S), window)
    scores = np.where(mask, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("kgts,skd->tkgd", p, v.astype(np.float64))
    return out.reshape(T, H, -1).astype(np.float32)
